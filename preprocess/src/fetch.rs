//! fetch (being written).

use crate::error::ErrorKind;

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("Failed to fetch media: {0}")]
    Upstream(String),
}

impl FetchError {
    pub fn kind(&self) -> ErrorKind {
        ErrorKind::Unprocessable
    }
}
