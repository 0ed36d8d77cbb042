//! The engine's integration tests, compiled into the crate so that they may call its crate-private operations
//! (the raw methods under the façade's handles) as well as the façade: real SQLite, tantivy, LanceDB and ONNX
//! Runtime in temporary data directories, and the real shared data sets.

mod engine;
mod scans;
mod scheduler;
mod service;
