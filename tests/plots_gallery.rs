//! Writes every chart as SVG, light and dark, under `target/plots-gallery/` for a look by eye:
//! `cargo test --test plots_gallery -- --ignored`. (Ignored: it asserts only that each renders.)

use trainmem::config::decode_query;
use trainmem::estimator::{estimate, sweep};
use trainmem::plots::{ChartData, ChartKind, DARK, LIGHT};

#[test]
#[ignore]
fn every_chart_renders_to_an_svg_file_for_inspection() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/plots-gallery");
    std::fs::create_dir_all(&dir).expect("create the gallery folder");
    let configs = [
        ("default", ""),
        ("qwen-eager", "model=qwen2.5-0.5b&attn=eager&gpu=h200"),
        ("llama70b-z3", "model=llama-3.1-70b&zero=3&gpus=8&seq=8192"),
        ("gpt2", "model=gpt2&unit=gib"),
    ];
    for (name, q) in configs {
        let cfg = decode_query(q).config;
        for kind in ChartKind::ALL {
            let data = match kind.axis() {
                Some(axis) => ChartData::from_sweep(sweep::run(axis, &cfg).expect("valid configuration"), &cfg),
                None => ChartData::timeline(&estimate(&cfg).expect("valid configuration"), &cfg),
            };
            for (t, theme) in [("light", &LIGHT), ("dark", &DARK)] {
                let svg = data.svg(theme, (900, 460));
                assert!(svg.starts_with("<svg"), "{name} {kind} renders");
                std::fs::write(dir.join(format!("{name}-{kind}-{t}.svg")), svg).expect("write");
            }
        }
    }
}
