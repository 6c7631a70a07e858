//! pool
