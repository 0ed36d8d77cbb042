-- 0008: a file that kills the process while it is read (a parser overflowing its stack, the kernel's OOM killer)
-- must not be read again at every restart, killing the appliance forever. `unfinished_starts` counts the times a
-- worker started reading the file and never finished: raised and committed before the file is read, lowered when
-- reading ends in any way short of a crash (indexed, rejected, store error, shutdown, cancel). See jobs.rs MAX_CRASHES.
ALTER TABLE job_files ADD COLUMN unfinished_starts INTEGER NOT NULL DEFAULT 0;
