//! Launchers for the attention kernels (being written).
