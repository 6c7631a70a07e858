//! Device memory shared between processes (`gpu::share`): packed buffers exported, imported
//! through their handle at another address, read in place, and released. On a GPU the import
//! is CUDA VMM's (`cuMemImportFromShareableHandle` in the same process maps the same physical
//! memory a second time); on the emulator a memfd mapped twice.
#![cfg(feature = "emu")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "gpu/util.rs"]
mod util;

use kernels::gpu::{Gpu, PackedWeights, SharedRegion};
use util::*;

checks!(packed_buffers_read_the_same_through_an_import);

/// Held by every test that maps shared memory: one of them counts this process's maps, which
/// the others would change under it when the tests run in parallel.
static MAPS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn maps_lock() -> std::sync::MutexGuard<'static, ()> {
    MAPS.lock().unwrap_or_else(|e| e.into_inner())
}

fn packed_buffers_read_the_same_through_an_import(gpu: &Gpu) {
    let _maps = maps_lock();
    let a: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5 - 7.0).collect();
    let b: Vec<u16> = (0..77).map(|i| i * 3).collect();
    let (ba, bb) = (gpu.upload(&a).unwrap(), gpu.upload(&b).unwrap());
    let packed =
        PackedWeights::pack(gpu, &[("a".to_string(), &ba), ("b".to_string(), &bb)]).unwrap();
    drop((ba, bb));
    assert!(packed.slots.iter().all(|s| s.offset % 256 == 0));
    assert!(packed.len_bytes() >= 4000 + 154);
    let handle = packed
        .region
        .handle()
        .expect("an exported region has a handle");
    let imported =
        PackedWeights::import(gpu, handle, packed.len_bytes(), packed.slots.clone()).unwrap();
    assert!(imported.region.handle().is_none());
    assert_ne!(imported.region.ptr(), packed.region.ptr());
    let va = imported.take("a", 4000).unwrap();
    assert_eq!(va.read::<f32>().unwrap(), a);
    assert_eq!(imported.take("b", 154).unwrap().read::<u16>().unwrap(), b);
    // A layout that does not fit the asker is refused by name.
    let e = imported.take("a", 3996).unwrap_err().to_string();
    assert!(e.contains("slot a holds 4000 bytes"), "{e}");
    assert!(imported.take("c", 4).is_err());
    // A view keeps its region mapped after the rest goes; the exporter's going does not
    // take the importer's memory with it.
    drop(imported);
    drop(packed);
    assert_eq!(va.read::<f32>().unwrap(), a);
}

/// Lines of this process's maps naming the emulator's shared memory.
fn shared_maps() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.contains("gateway-device-weights"))
        .count()
}

#[test]
fn emu_imported_memory_is_read_only_and_released_with_its_last_view() {
    let _maps = maps_lock();
    let gpu = Gpu::emulator();
    let other = Gpu::emulator();
    let before = shared_maps();
    let region = SharedRegion::export(&gpu, 4096).unwrap();
    gpu.write(region.ptr(), &[1u8; 16]).unwrap();
    let imported =
        std::sync::Arc::new(SharedRegion::import(&other, region.handle().unwrap(), 4096).unwrap());
    assert_eq!(shared_maps(), before + 2);
    let view = imported.view(0, 16).unwrap();
    assert_eq!(view.read::<u8>().unwrap(), vec![1u8; 16]);
    let e = other.write(view.ptr(), &[2u8; 4]).unwrap_err().to_string();
    assert!(e.contains("read-only"), "{e}");
    let e = other.memset(view.ptr(), 0, 4).unwrap_err().to_string();
    assert!(e.contains("read-only"), "{e}");
    assert!(imported.view(4000, 200).is_err());
    // The exporter writes, the importer sees it: one memory, not a copy.
    gpu.write(region.ptr(), &[9u8; 2]).unwrap();
    assert_eq!(view.read::<u8>().unwrap()[..3], [9, 9, 1]);
    drop(imported);
    assert_eq!(shared_maps(), before + 2, "a live view keeps the mapping");
    drop(view);
    drop(region);
    assert_eq!(shared_maps(), before);
}

#[test]
fn emu_a_short_handle_is_refused() {
    let _maps = maps_lock();
    let gpu = Gpu::emulator();
    let region = SharedRegion::export(&gpu, 4096).unwrap();
    let e = SharedRegion::import(&gpu, region.handle().unwrap(), 8192)
        .unwrap_err()
        .to_string();
    assert!(e.contains("holds 4096 bytes, 8192 were announced"), "{e}");
}
