//! Launchers for the sampling kernels (being written).
