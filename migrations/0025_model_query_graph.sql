-- Which of a model's ONNX graphs encodes queries: `fp32` (model.onnx) or `int8` (model_int8.onnx, which trained
-- query packages carry beside it). The evaluation gate times and scores both; a promotion serves the one it chose.
-- Documents are always encoded by the fp32 graph.
ALTER TABLE models ADD COLUMN query_graph TEXT NOT NULL DEFAULT 'fp32' CHECK (query_graph IN ('fp32', 'int8'));
