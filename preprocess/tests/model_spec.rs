//! A checkpoint folder's processor files give the media spec the pipeline runs with.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use preprocess::image::{ImageProcessor, Qwen2VlConfig};
use preprocess::pipeline::ModelMediaSpec;
use serde_json::json;

#[test]
fn model_dirs_give_their_processors() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data");
    let vl = ModelMediaSpec::from_model_dir(&root.join("tiny-qwen2-vl")).unwrap();
    match &vl.image {
        Some(ImageProcessor::Qwen2Vl(c)) => {
            assert_eq!((c.min_pixels, c.max_pixels), (3136, 12_845_056));
            assert_eq!(
                (c.patch_size, c.merge_size, c.temporal_patch_size),
                (14, 2, 2)
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(vl.video.is_some() && vl.audio.is_none());
    let audio = ModelMediaSpec::from_model_dir(&root.join("tiny-qwen2-audio")).unwrap();
    assert_eq!(audio.audio.as_ref().map(|a| a.n_mels), Some(128));
    assert!(audio.image.is_none() && audio.video.is_none());
    // A folder without processor files takes no media.
    assert_eq!(
        ModelMediaSpec::from_model_dir(&root).unwrap(),
        ModelMediaSpec::default()
    );
}

#[test]
fn invalid_processor_values_are_refused() {
    for bad in [
        json!({"patch_size": 0}),
        json!({"image_std": [1, 0, 1]}),
        json!({"image_mean": [0.5, 0.5]}),
        json!({"min_pixels": 10, "max_pixels": 5}),
        json!([1, 2]),
    ] {
        assert!(
            Qwen2VlConfig::from_preprocessor_config(&bad).is_err(),
            "{bad}"
        );
    }
    let ok = Qwen2VlConfig::from_preprocessor_config(
        &json!({"max_pixels": 50176, "image_mean": [0.5, 0.5, 0.5]}),
    )
    .unwrap();
    assert_eq!(ok.max_pixels, 50176);
    assert_eq!(ok.image_mean, [0.5; 3]);
}
