-- 0013: the fusion weights travel with the live pair. A promotion writes the dense weight the evaluation gate
-- fitted for the candidate (the weight it was judged with), and keeps here the weights in force just before, so that
-- rollback restores them. NULL on rows older than this migration: rollback then leaves the weights as they are.
ALTER TABLE model_history ADD COLUMN fusion_before TEXT;
