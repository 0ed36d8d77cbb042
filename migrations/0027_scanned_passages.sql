-- 0027: a passage read from scanned pages by the OCR keeps those pages (first and last) and the least confidence of
-- its lines, so a clinician sees 识别自扫描件 · 第 N 页 and can tell a passage read with little confidence. NULL for
-- typed text.
ALTER TABLE chunks ADD COLUMN scan_page INTEGER;
ALTER TABLE chunks ADD COLUMN scan_last_page INTEGER;
ALTER TABLE chunks ADD COLUMN scan_confidence REAL;
