//! The contract suite lives in `tests/`.
