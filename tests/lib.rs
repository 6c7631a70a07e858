//! Nothing to link: this package's work is its integration tests (`tests/tests/`), which start
//! the built `gateway` binary and talk to it over loopback, and the checkpoints in `tests/data/`.
