//! The policy layers: tower services over the typed request, run before any media or model
//! work, in the order CONTRACT section 2 gives:
//!
//! `TrustGate -> Merge (deployment defaults) -> Bounds (trusted-client profile) -> Limits`
//!
//! Each layer is one small piece with one decision; adding a policy is adding a layer. The
//! request travels as [`Policed`], which carries the typed request and what the layers learn
//! (whether the client is trusted, the merged kwargs).

mod layers;

pub use layers::{run_policies, MediaCounts, Policed, PolicyRequest, RequestKwargs};

/// The pooling-family requests carry the kwargs in their flattened `pooling` fields.
#[macro_export]
macro_rules! pooling_policy_request {
    ($ty:ty) => {
        impl $crate::policy::PolicyRequest for $ty {
            fn mm_processor_kwargs(&self) -> Option<$crate::policy::RequestKwargs<'_>> {
                self.pooling
                    .mm_processor_kwargs
                    .as_ref()
                    .map($crate::policy::RequestKwargs::Value)
            }
            fn media_io_kwargs(&self) -> Option<$crate::policy::RequestKwargs<'_>> {
                self.pooling
                    .media_io_kwargs
                    .as_ref()
                    .map($crate::policy::RequestKwargs::Value)
            }
        }
    };
}
