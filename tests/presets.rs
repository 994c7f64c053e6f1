//! Every preset pinned to its exact parameter count. A family's presets live in its file
//! (`src/estimator/step/families/<family>.rs`); their counts are pinned here, beside the other
//! tests, so that adding a family touches no shared source file for its count.

use trainmem::estimator::presets::{preset, presets};

/// Published counts: the sum of `numel` over each checkpoint's safetensors (tied weights
/// once), as its model card and `model.safetensors.index.json` give them.
const PUBLISHED: &[(&str, u64)] = &[
    ("gpt2", 124_439_808),
    ("gpt2-medium", 354_823_168),
    ("gpt2-large", 774_030_080),
    ("gpt2-xl", 1_557_611_200),
    ("llama-2-7b", 6_738_415_616),
    ("llama-2-13b", 13_015_864_320),
    ("llama-2-70b", 68_976_648_192),
    ("llama-3.1-8b", 8_030_261_248),
    ("llama-3.1-70b", 70_553_706_496),
    ("llama-3.1-405b", 405_853_388_800),
    ("llama-3.2-1b", 1_235_814_400),
    ("llama-3.2-3b", 3_212_749_824),
    ("mistral-7b-v0.1", 7_241_732_096),
    ("mixtral-8x7b-v0.1", 46_702_792_704),
    ("qwen2.5-0.5b", 494_032_768),
    ("qwen2.5-7b", 7_615_616_512),
    ("qwen2.5-72b", 72_706_203_648),
    ("gemma-2-2b", 2_614_341_888),
    ("gemma-2-9b", 9_241_705_984),
    ("gemma-2-27b", 27_227_128_320),
    ("phi-3-mini-4k-instruct", 3_821_079_552),
];

/// The 2026 presets: transformers 5.24's count on the meta device (tests/fixtures/hf/count.py)
/// — for a multimodal checkpoint its text model's — with the published figure it rounds to.
const COUNTED: &[(&str, u64)] = &[
    ("phi-4", 14_659_507_200),                               // 14.7 B
    ("falcon-h1-0.5b-instruct", 521_411_104),                // 0.5 B (transformers 5.24 on the meta device)
    ("granite-4.0-h-tiny", 6_939_037_248),                   // 7 B total, 1 B active (transformers 5.24 on the meta device)
    ("qwen3-next-80b-a3b-thinking", 79_674_391_296),         // 80 B (transformers 5.24 on the meta device)
    ("qwen3.5-27b", 26_895_998_464),                         // 27 B (its text model; transformers 5.24 on the meta device)
    ("qwen3.5-35b-a3b", 34_660_610_688),                     // 35 B (its text model)
    ("qwen3-0.6b", 596_049_920),                             // 0.6 B
    ("qwen3-1.7b", 1_720_574_976),                           // 1.7 B
    ("qwen3-4b", 4_022_468_096),                             // 4.0 B
    ("qwen3-8b", 8_190_735_360),                             // 8.2 B
    ("qwen3-14b", 14_768_307_200),                           // 14.8 B
    ("qwen3-32b", 32_762_123_264),                           // 32.8 B
    ("qwen3-30b-a3b", 30_532_122_624),                       // 30.5 B
    ("qwen3-235b-a22b", 235_093_634_560),                    // 235 B
    ("gemma-3-1b-it", 999_885_952),                          // 1.0 B
    ("gemma-3-4b-it", 3_880_263_168),                        // 4.3 B with the 419.8 M vision tower
    ("gemma-3-12b-it", 11_766_034_176),                      // 12.2 B with the 421.3 M vision tower
    ("gemma-3-27b-it", 27_009_346_304),                      // 27.4 B with the 423.1 M vision tower
    ("olmo-2-1124-7b", 7_298_617_344),                       // 7.3 B
    ("olmo-2-1124-13b", 13_716_198_400),                     // 13.7 B
    ("smollm3-3b", 3_075_098_624),                           // 3.1 B
    ("mistral-small-3.1-24b-instruct-2503", 23_572_403_200), // 24,011,361,280 with the vision tower
    ("deepseek-v3", 671_026_404_352),                        // 671 B, MTP layer excluded
    ("deepseek-v3.2", 671_877_929_216),                      // 671 B + 851.5 M of indexers, MTP layer excluded
    ("deepseek-v2-lite", 15_706_484_224),                    // 15.7 B
    ("kimi-k2-instruct", 1_026_408_209_408),                 // 1.03 T
    ("gpt-oss-20b", 20_914_757_184),                         // 20.9 B
    ("gpt-oss-120b", 116_829_156_672),                       // 116.8 B
    ("llama-4-scout-17b-16e-instruct", 107_769_861_120),     // 108.6 B with the 871.9 M vision tower
    ("llama-4-maverick-17b-128e-instruct", 400_711_848_960), // 401.6 B with the vision tower
    ("glm-4.5-air", 106_852_245_504),                        // 106 B, MTP layer excluded
    ("seed-oss-36b-instruct", 36_151_104_512),               // 36 B
    ("olmo-3-1025-7b", 7_298_011_136),                       // 7 B
    ("exaone-4.0-32b", 32_003_216_384),                      // 32.0 B
    ("apertus-8b-2509", 8_053_338_176),                      // 8 B
    ("minimax-m2.5", 228_689_748_992),                       // 230 B total / 10 B active, MTP modules excluded
    ("kimi-linear-48b-a3b", 49_122_675_072),                 // 48 B total / 3 B active (transformers 5.24 on the meta device)
];

#[test]
fn every_preset_counts_exactly_its_published_parameters() {
    let all = presets();
    assert_eq!(all.len(), PUBLISHED.len() + COUNTED.len(), "every preset needs a pinned count");
    for (id, want) in PUBLISHED.iter().chain(COUNTED) {
        let p = preset(id).unwrap_or_else(|| panic!("no preset {id}"));
        assert_eq!(p.spec.counts().total, *want, "{id}");
    }
}

#[test]
fn the_presets_from_before_2026_use_no_new_architectural_feature_except_their_windows() {
    for (id, _) in PUBLISHED {
        let p = preset(id).unwrap_or_else(|| panic!("no preset {id}"));
        let f: Vec<_> = p.spec.features().into_iter().filter(|f| !f.contains("sliding-window")).collect();
        assert!(f.is_empty(), "{id}: {f:?}");
    }
}
