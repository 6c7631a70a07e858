//! A switch for tests that must see the engine fail where nothing else can make it fail on
//! demand: `ENGINE_FAULT_INJECT=scheduler-panic` panics in the scheduler's step, outside the
//! model's panic guard, as a bug there would. It exists only in builds with the `fault-inject`
//! feature, which `make test` turns on and no release build does: a product binary has no
//! variable that crashes it.

#[cfg(feature = "fault-inject")]
use std::sync::OnceLock;

/// Whether the scheduler should panic at its next step.
#[cfg(feature = "fault-inject")]
pub(crate) fn scheduler_panic() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        let on = std::env::var("ENGINE_FAULT_INJECT").is_ok_and(|v| v == "scheduler-panic");
        if on {
            tracing::warn!("ENGINE_FAULT_INJECT=scheduler-panic: the scheduler will panic");
        }
        on
    })
}

/// Without the `fault-inject` feature nothing is injected.
#[cfg(not(feature = "fault-inject"))]
pub(crate) const fn scheduler_panic() -> bool {
    false
}
