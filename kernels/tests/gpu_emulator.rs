//! The emulator itself: every kernel in the sources is registered with it, it computes what a
//! GPU computes for warp and block reductions, and it refuses what a GPU would get silently
//! wrong (the `emu_selftest_*` kernels break one rule each).
#![cfg(feature = "emu")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kernels::gpu::{Arg, Gpu, GpuError, Launch};

#[test]
fn every_kernel_in_the_sources_is_registered() {
    let mut declared: Vec<String> = kernels::gpu::sources::all_kernels()
        .into_iter()
        .map(|(_, k)| k.to_string())
        .collect();
    declared.sort();
    let registered: Vec<String> = kernels::gpu::emulated_kernels()
        .into_iter()
        .filter(|k| !k.starts_with("emu_selftest_"))
        .collect();
    assert!(!declared.is_empty());
    assert_eq!(declared, registered);
}

#[test]
fn reductions_match_the_host() {
    let gpu = Gpu::emulator();
    let input: Vec<f32> = (0..256).map(|i| ((i * 37) % 101) as f32 - 50.0).collect();
    let inb = gpu.upload(&input).unwrap();
    let out = gpu.zeros(8).unwrap();
    gpu.launch(
        "emu_selftest_block_sum",
        Launch::new([1, 1, 1], 256),
        &[(&out).into(), (&inb).into()],
    )
    .unwrap();
    let got = out.read::<f32>().unwrap();
    assert_eq!(got[0], input.iter().sum::<f32>());
    assert_eq!(got[1], input.iter().cloned().fold(f32::MIN, f32::max));
}

fn launch_error(kernel: &str, grid: u32, args: &[Arg], gpu: &Gpu) -> String {
    match gpu.launch(kernel, Launch::new([grid, 1, 1], 64), args) {
        Err(GpuError::Launch { message, .. }) => message,
        other => panic!("{kernel}: expected a launch error, got {other:?}"),
    }
}

#[test]
fn catches_out_of_bounds_writes() {
    let gpu = Gpu::emulator();
    let out = gpu.alloc(100 * 4).unwrap();
    let msg = launch_error(
        "emu_selftest_out_of_bounds",
        2,
        &[(&out).into(), Arg::I32(100)],
        &gpu,
    );
    assert!(msg.contains("past the end"), "{msg}");
}

#[test]
fn catches_a_barrier_some_threads_skip() {
    let gpu = Gpu::emulator();
    let out = gpu.alloc(64 * 4).unwrap();
    let msg = launch_error("emu_selftest_early_exit", 1, &[(&out).into()], &gpu);
    assert!(msg.contains("__syncthreads"), "{msg}");
}

#[test]
fn catches_a_shuffle_half_a_warp_skips() {
    let gpu = Gpu::emulator();
    let out = gpu.alloc(64 * 4).unwrap();
    let msg = launch_error("emu_selftest_divergent_shuffle", 1, &[(&out).into()], &gpu);
    assert!(msg.contains("16 of 32 lanes"), "{msg}");
}

#[test]
fn checks_argument_counts_and_sizes() {
    let gpu = Gpu::emulator();
    let out = gpu.alloc(64 * 4).unwrap();
    let msg = launch_error("emu_selftest_out_of_bounds", 1, &[(&out).into()], &gpu);
    assert!(msg.contains("takes 2 arguments"), "{msg}");
    let msg = launch_error(
        "emu_selftest_out_of_bounds",
        1,
        &[(&out).into(), Arg::U64(3)],
        &gpu,
    );
    assert!(msg.contains("argument 1"), "{msg}");
}

#[test]
fn refuses_pointers_outside_allocations() {
    let gpu = Gpu::emulator();
    let msg = launch_error(
        "emu_selftest_early_exit",
        1,
        &[Arg::Ptr(kernels::gpu::DevicePtr(0x1000))],
        &gpu,
    );
    assert!(msg.contains("not inside one device allocation"), "{msg}");
}

#[test]
fn refuses_a_block_over_the_kernels_launch_bound() {
    let gpu = Gpu::emulator();
    let out = gpu.alloc(128 * 4).unwrap();
    // The self-test kernels are in no source, so `Gpu::launch` has no bound for them: the
    // emulator's own check answers, from the bound the kernel was compiled with (64).
    match gpu.launch(
        "emu_selftest_early_exit",
        Launch::new([1, 1, 1], 128),
        &[(&out).into()],
    ) {
        Err(GpuError::Launch { message, .. }) => assert!(
            message.contains("emu_selftest_early_exit")
                && message.contains("__launch_bounds__ of 64"),
            "{message}"
        ),
        other => panic!("expected a launch error, got {other:?}"),
    }
}

/// A read of another thread's shared write with no barrier between gets the new value in some
/// blocks and the stale one in others (the emulator alternates the threads' order by block),
/// so a test comparing with a reference sees it.
#[test]
fn a_missing_barrier_makes_blocks_disagree() {
    let gpu = Gpu::emulator();
    let out = gpu.alloc(2 * 64 * 4).unwrap();
    gpu.launch(
        "emu_selftest_missing_barrier",
        Launch::new([2, 1, 1], 64),
        &[(&out).into()],
    )
    .unwrap();
    let got = out.read::<f32>().unwrap();
    // With a barrier every thread would read its neighbour's value: block b, thread t ^ 1.
    let fresh = |b: usize, t: usize| got[b * 64 + t] == (b * 1000 + (t ^ 1)) as f32;
    let fresh_even: Vec<bool> = (0..64).map(|t| fresh(0, t)).collect();
    let fresh_odd: Vec<bool> = (0..64).map(|t| fresh(1, t)).collect();
    assert!(
        fresh_even.iter().any(|f| !f) && fresh_odd.iter().any(|f| !f),
        "both blocks saw a stale value somewhere: {got:?}"
    );
    assert_ne!(
        fresh_even, fresh_odd,
        "the two orders expose different threads"
    );
}
