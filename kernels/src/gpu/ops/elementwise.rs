//! Launchers for the elementwise kernels (being written).
