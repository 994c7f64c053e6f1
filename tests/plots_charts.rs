//! The charts and the stacked bar as the app draws them, rendered to SVG natively: what they
//! say (titles, legends, ticks, marked limits) and what their geometry means (the s² term's
//! slope, the read-out's pixel ↔ data transform), against the estimator's own answers.

use trainmem::config::{decode_query, Attention, Config, Unit, Zero};
use trainmem::estimator::expr::group_digits;
use trainmem::estimator::sweep::{self, fits, GPU_COUNTS};
use trainmem::estimator::{estimate, ledger::Bytes, EstimateError};
use trainmem::plots::bar::{bar_data, bar_height, bar_svg, draw_bar};
use trainmem::plots::batch::{batch_svg, BatchData};
use trainmem::plots::draw::Part;
use trainmem::plots::gpus::{gpus_svg, GpusData};
use trainmem::plots::params::{params_svg, ParamsData};
use trainmem::plots::seq::{draw_seq, seq_svg, SeqData};
use trainmem::plots::timeline::{timeline_data, timeline_svg};
use trainmem::plots::{draw_scene, hex, svg_of, ChartData, ChartKind, Frame, DARK, LIGHT, PROJECTOR};

const SIZE: (u32, u32) = (960, 480);

/// The chart the app shows for `kind`: the estimator's sweep (or the estimate's timeline),
/// drawn for `cfg`.
fn chart_data(kind: ChartKind, cfg: &Config) -> Result<ChartData, EstimateError> {
    match kind.axis() {
        Some(axis) => Ok(ChartData::from_sweep(sweep::run(axis, cfg)?, cfg)),
        None => Ok(ChartData::timeline(&estimate(cfg)?, cfg)),
    }
}

/// The sweep key of a chart (the timeline has none: it is the configuration itself).
fn sweep_key(kind: ChartKind, cfg: &Config) -> Config {
    kind.axis().map_or_else(|| cfg.clone(), |a| sweep::key(a, cfg))
}

fn seq_data(cfg: &Config) -> SeqData {
    SeqData::new(sweep::seq_sweep(cfg), cfg)
}
fn batch_data(cfg: &Config) -> BatchData {
    BatchData::new(sweep::batch_sweep(cfg), cfg)
}
fn gpus_data(cfg: &Config) -> GpusData {
    GpusData::new(sweep::gpus_sweep(cfg), cfg)
}
fn params_data(cfg: &Config) -> ParamsData {
    ParamsData::new(sweep::params_sweep(cfg), cfg)
}

fn cfg(q: &str) -> Config {
    let d = decode_query(q);
    assert_eq!(d.errors, vec![], "{q}");
    d.config
}

/// The text elements of an SVG document, trimmed (plotters writes each on its own line).
fn texts(svg: &str) -> Vec<String> {
    svg.split("<text").skip(1).filter_map(|t| Some(t[t.find('>')? + 1..t.find("</text>")?].trim().to_string())).collect()
}

/// Whether one of the SVG's text elements is exactly `s` (a tick label, say).
fn has_text(svg: &str, s: &str) -> bool {
    texts(svg).iter().any(|t| t == s)
}

/// The log-log slope between two lengths of a sweep: ln(M(b) / M(a)) / ln(b / a).
fn slope(seqs: &[u64], bytes: &[Option<Bytes>], a: u64, b: u64) -> f64 {
    let at = |s: u64| {
        let i = seqs.iter().position(|x| *x == s).unwrap_or_else(|| panic!("{s} is a sweep point"));
        bytes[i].unwrap_or_else(|| panic!("a value at {s}")) as f64
    };
    (at(b) / at(a)).ln() / (b as f64 / a as f64).ln()
}

/// A small model at batch 8, where activations dwarf the ~8 GB of model states. Per layer and
/// token, eager attention keeps b·a·s scores in bf16 plus their fp32 softmax (≈ 6 B × 14 heads
/// × s), against ≈ 30 KB of everything linear in s: at 8K tokens the s² part is already ~3×
/// the linear part, and the memory grows almost 16× from 8K to 32K tokens (slope → 2), while
/// with SDPA it grows 4× (slope → 1).
fn small_model(attn: &str) -> Config {
    cfg(&format!("model=qwen2.5-0.5b&batch=8&attn={attn}&gpu=h200"))
}

#[test]
fn the_eager_curve_rises_with_slope_two_and_the_sdpa_curve_with_slope_one_on_log_log_axes() {
    let eager = seq_data(&small_model("eager"));
    let peaks: Vec<Option<Bytes>> = eager.peaks().into_iter().map(Some).collect();
    let s_eager = slope(&eager.sweep.seqs, &peaks, 8192, 32768);
    let s_sdpa = slope(&eager.sweep.seqs, &eager.sweep.other_peak, 8192, 32768);
    assert!((s_eager - 2.0).abs() < 0.12, "eager slope {s_eager:.3}");
    assert!((s_sdpa - 1.0).abs() < 0.06, "sdpa slope {s_sdpa:.3}");
    // The overlay of an sdpa configuration is the same eager curve.
    let sdpa = seq_data(&small_model("sdpa"));
    assert_eq!(sdpa.sweep.other, Attention::Eager);
    assert_eq!(sdpa.sweep.other_peak, peaks);
}

/// The polylines of one stroke colour and width in an SVG document, as pixel points.
fn polylines(svg: &str, stroke: &str, width: u32) -> Vec<Vec<(i32, i32)>> {
    let needle = format!("stroke=\"{stroke}\" stroke-width=\"{width}\" points=\"");
    svg.match_indices(&needle)
        .map(|(i, _)| {
            let rest = &svg[i + needle.len()..];
            let pts = &rest[..rest.find('"').unwrap_or(0)];
            pts.split_whitespace()
                .filter_map(|p| p.split_once(','))
                .map(|(x, y)| (x.parse().expect("x pixel"), y.parse().expect("y pixel")))
                .collect()
        })
        .collect()
}

/// Draws the sequence chart into an SVG string, keeping its frame.
fn seq_svg_and_frame(data: &SeqData) -> (String, Frame) {
    let (scene, frame) = draw_scene(SIZE, |root| draw_seq(root, data, &LIGHT).expect("draws").0);
    (scene.svg(), frame)
}

/// The slope between the drawn vertices nearest 8K and 32K tokens, read back from pixels.
fn drawn_slope(data: &SeqData) -> f64 {
    let (svg, frame) = seq_svg_and_frame(data);
    let lines = polylines(&svg, &hex(LIGHT.foreground).to_uppercase(), 2);
    assert_eq!(lines.len(), 1, "one unclipped peak line on the log axis");
    let pts: Vec<(f64, f64)> = lines[0].iter().map(|p| frame.from_px(*p).expect("inside the chart")).collect();
    let near = |s: f64| pts.iter().copied().find(|(x, _)| (x / s - 1.0).abs() < 0.02).unwrap_or_else(|| panic!("a vertex at {s}"));
    let (a, b) = (near(8192.0), near(32768.0));
    (b.1 / a.1).ln() / (b.0 / a.0).ln()
}

#[test]
fn the_drawn_curves_read_back_from_the_svg_have_the_same_slopes() {
    // On the log memory axis, one pixel is ~0.01 decade: the slope read from pixels is within
    // a few hundredths of the data's.
    for (attn, want) in [("eager", 2.0), ("sdpa", 1.0)] {
        let mut d = seq_data(&small_model(attn));
        d.log_y = true;
        let s = drawn_slope(&d);
        assert!((s - want).abs() < 0.15, "{attn}: drawn slope {s:.3}");
    }
}

#[test]
fn the_oom_mark_is_the_longest_sequence_that_fits_and_is_labelled() {
    let c = cfg("model=qwen2.5-0.5b&attn=eager&gpu=h200");
    let d = seq_data(&c);
    let n = d.sweep.limit.expect("fits at short lengths");
    assert!(n < d.sweep.range.1, "the crossing lies inside the range");
    // The estimator's own verdict on either side of the mark.
    assert!(fits(&Config { seq: n, ..c.clone() }));
    assert!(!fits(&Config { seq: n + 1, ..c.clone() }));
    assert!(trainmem::estimator::analyse(&Config { seq: n + 1, ..c.clone() }).expect("valid").verdict.deciding > d.sweep.capacity);
    let label = format!("OOM beyond {} tokens", group_digits(n as u128));
    assert_eq!(d.limit_text(), label);
    assert!(seq_svg(&d, &LIGHT, SIZE).contains(&label));
}

#[test]
fn the_sequence_chart_has_its_title_axes_legend_and_context_length_ticks() {
    let d = seq_data(&Config::default());
    let svg = seq_svg(&d, &LIGHT, SIZE);
    for text in [
        "Peak memory vs sequence length — llama-3.1-8b (sdpa attention)",
        "Sequence length (tokens, log scale)",
        "Memory per GPU (GB)",
        "Parameters",
        "Optimizer states",
        "Activations",
        "Peak with eager attention",
        "NVIDIA H100 80 GB (SXM) capacity",
    ] {
        assert!(svg.contains(text), "missing {text}");
    }
    for tick in ["128", "1K", "32K", "128K"] {
        assert!(has_text(&svg, tick), "no tick {tick} in {:?}", texts(&svg));
    }
    // 8B with AdamW holds 128 GB of model states: no length fits an 80 GB card.
    assert_eq!(d.sweep.limit, None);
    assert!(svg.contains("OOM at every length"));
    // Llama 3.1's 131,072 positions end the axis.
    assert_eq!(d.sweep.range, (128, 131_072));
}

#[test]
fn the_stack_is_the_peak_composition_and_adds_up_to_the_peak() {
    let c = Config::default();
    let d = seq_data(&c);
    for (s, p) in d.sweep.seqs.iter().zip(d.peaks()) {
        // The curve is the fast figure (allocated + context, cuBLAS, NCCL).
        let e = estimate(&Config { seq: *s, ..c.clone() }).expect("valid");
        assert_eq!(p, e.memory.peak, "at {s}");
    }
}

#[test]
fn switching_to_gib_relabels_the_memory_axis() {
    let d = seq_data(&cfg("unit=gib"));
    assert!(seq_svg(&d, &LIGHT, SIZE).contains("Memory per GPU (GiB)"));
}

#[test]
fn the_dark_theme_paints_a_dark_background() {
    let d = seq_data(&Config::default());
    let svg = seq_svg(&d, &DARK, SIZE);
    assert!(svg.contains(&hex(DARK.background).to_uppercase()));
    assert!(!svg.contains(&hex(LIGHT.background).to_uppercase()));
}

#[test]
fn the_read_out_maps_every_drawn_point_back_to_its_own_row() {
    let d = seq_data(&small_model("eager"));
    let (_, frame) = seq_svg_and_frame(&d);
    let table = d.table(&LIGHT);
    for (i, x) in table.x.iter().enumerate() {
        let px = frame.to_px(*x, frame.y_axis().lo());
        assert_eq!(frame.index_at(&table.x, px, 6), Some(i), "x = {x}");
        let (back, _) = frame.from_px(px).expect("inside");
        // One pixel of a 7-octave axis ~850 px wide is under 1 % of the value.
        assert!((back / x - 1.0).abs() < 0.01, "{x} read back as {back}");
    }
    // Far left of the plot, there is nothing to read.
    assert_eq!(frame.index_at(&table.x, (0, 100), 6), None);
}

#[test]
fn the_csv_has_one_row_per_point_and_the_exact_bytes() {
    let d = seq_data(&Config::default());
    let csv = ChartData::Seq(d.clone()).csv();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], "seq,parameters_bytes,gradients_bytes,optimizer_states_bytes,activations_bytes,transient_buffers_bytes,framework_overhead_bytes,peak_sdpa_bytes,peak_eager_bytes");
    assert_eq!(lines.len(), d.sweep.seqs.len() + 1);
    let first: Vec<&str> = lines[1].split(',').collect();
    assert_eq!(first[0], "128");
    assert_eq!(first[7], d.peaks()[0].to_string());
}

#[test]
fn the_largest_micro_batch_is_exact_and_labelled() {
    let c = cfg("model=qwen2.5-0.5b&seq=2048");
    let d = batch_data(&c);
    let b = d.sweep.limit.expect("a 0.5B model fits at micro-batch 1");
    assert!(fits(&Config { batch: b, ..c.clone() }));
    assert!(!fits(&Config { batch: b + 1, ..c.clone() }));
    let svg = batch_svg(&d, &LIGHT, SIZE);
    assert!(svg.contains(&format!("Largest micro-batch that fits: {}", group_digits(b as u128))));
    assert!(svg.contains("Micro-batch per GPU (log scale)"));
    // The axis reaches past the limit (to twice it, a power of two).
    assert!(d.sweep.range.1 >= 2 * b && d.sweep.range.1.is_power_of_two());
    // The stack at each point is the estimator's peak there.
    let i = d.sweep.batches.iter().position(|x| *x == 4).expect("4 is a sweep point");
    assert_eq!(d.peaks()[i], estimate(&Config { batch: 4, ..c }).expect("valid").memory.peak);
}

#[test]
fn sharding_decides_how_many_gpus_llama_8b_needs() {
    // Model states are 16 B/param × 8.03 B = 128 GB: DDP replicates them on every GPU (never
    // fits an 80 GB card); ZeRO-3 divides them by the GPU count.
    let c = Config::default();
    let d = gpus_data(&c);
    let line = |z: Zero| d.sweep.lines.iter().find(|l| l.zero == z).expect("a line per stage");
    assert_eq!(line(Zero::Ddp).fewest, None);
    let n = line(Zero::Z3).fewest.expect("ZeRO-3 fits on some number of GPUs");
    assert!(fits(&Config { gpus: n, zero: Zero::Z3, ..c.clone() }));
    assert!(!fits(&Config { gpus: n - 1, zero: Zero::Z3, ..c.clone() }));
    // ZeRO-3 shards more than ZeRO-1, so it never needs more GPUs.
    assert!(line(Zero::Z1).fewest.is_none_or(|m| m >= n));
    let svg = gpus_svg(&d, &LIGHT, SIZE);
    for text in [format!("ZeRO-3: fits from {n} GPUs"), "DDP: does not fit".into(), "GPUs (log scale)".into(), "ZeRO-1".into()] {
        assert!(svg.contains(&text), "missing {text}");
    }
    assert!(has_text(&svg, "1,024") && has_text(&svg, "1"), "{:?}", texts(&svg));
    // 1, 2, 4, …, 1,024 GPUs.
    assert_eq!(d.sweep.gpus.len(), 11);
}

#[test]
fn the_model_size_chart_names_the_family_sizes_and_where_each_gpu_count_stops_fitting() {
    let c = cfg("zero=3");
    let d = params_data(&c);
    let svg = params_svg(&d, &LIGHT, SIZE);
    for tick in ["8B", "70B", "405B", "1T"] {
        assert!(has_text(&svg, tick), "no tick {tick} in {:?}", texts(&svg));
    }
    for text in ["Largest that fits:", "Llama 3.1 presets", "Activations", "Parameters (log scale; current architecture scaled)"] {
        assert!(svg.contains(text), "missing {text}");
    }
    for gi in 0..GPU_COUNTS.len() {
        assert!(svg.contains(&d.limit_text(gi)), "missing {}", d.limit_text(gi));
    }
    // ZeRO-3 divides the model states by the GPU count: on 64 GPUs a model several times
    // larger fits than on one.
    let l: Vec<u64> = d.sweep.limits.iter().map(|l| l.expect("something fits")).collect();
    assert!(l[0] < l[1] && l[1] < l[2], "{l:?}");
    assert!(l[2] > 4 * l[0], "{l:?}");
    // Static memory per GPU on 8 GPUs is an eighth of one GPU's, once the model is large enough
    // that ZeRO's fixed-size communication buckets (counted with the gradients) are negligible.
    let mut checked = 0;
    for ((p, one), eight) in d.sweep.params.iter().zip(&d.sweep.statics[0]).zip(&d.sweep.statics[1]) {
        let (one, eight) = (one.expect("valid") as f64, eight.expect("valid") as f64);
        if *p >= 20_000_000_000 {
            assert!((one / eight / 8.0 - 1.0).abs() < 0.03, "{p}: {one} vs {eight}");
            checked += 1;
        }
    }
    assert!(checked >= 4, "{checked} points of 20B and more");
    // The preset dot of the configured model is the configuration's own peak.
    let own = d.sweep.presets.iter().find(|p| p.id == "llama-3.1-8b").expect("the family includes the model");
    assert_eq!(own.peak[0], Some(estimate(&Config { gpus: 1, ..c.clone() }).expect("valid").memory.peak));
}

#[test]
fn under_ddp_more_gpus_do_not_make_a_larger_model_fit() {
    let d = params_data(&Config::default());
    let l: Vec<u64> = d.sweep.limits.iter().map(|l| l.expect("small models fit")).collect();
    // Replicas each hold everything (and more GPUs add NCCL and bucket buffers).
    assert!(l[1] <= l[0] && l[2] <= l[0], "{l:?}");
}

#[test]
fn the_timeline_marks_the_peak_event_and_adds_up_every_event() {
    let c = Config::default();
    let e = estimate(&c).expect("valid");
    let d = timeline_data(&e, &c);
    assert_eq!(d.steps.len(), e.timeline.events.len());
    assert_eq!(d.peak_bytes(), e.memory.peak);
    let totals = d.totals();
    let max = totals.iter().copied().max().expect("events");
    assert_eq!(totals[d.peak], max);
    let svg = timeline_svg(&d, &LIGHT, SIZE);
    let text = d.peak_text();
    assert!(text.starts_with("Peak ") && text.contains(&e.memory.peak_event), "{text}");
    assert!(svg.contains(&text));
    for t in ["Memory during one training step — llama-3.1-8b", "Events of the step"] {
        assert!(svg.contains(t), "missing {t}");
    }
    assert!(has_text(&svg, "loss") && has_text(&svg, "start"), "{:?}", texts(&svg));
    // The CSV names each event.
    let csv = ChartData::Timeline(d).csv();
    assert!(csv.starts_with("event,label,"));
    assert!(csv.contains(",forward layer 1,"));
    assert_eq!(csv.lines().count(), e.timeline.events.len() + 1);
}

#[test]
fn every_chart_renders_light_and_dark_in_both_units() {
    for q in ["", "model=gpt2&unit=gib", "model=mixtral-8x7b-v0.1&gpus=8&ep=8&zero=3", "model=llama-3.1-70b&gpus=64&tp=8&pp=2&zero=1"] {
        let c = cfg(q);
        for kind in ChartKind::ALL {
            let d = chart_data(kind, &c).expect("valid");
            assert_eq!(d.kind(), kind);
            for theme in [&LIGHT, &DARK] {
                let svg = d.svg(theme, (640, 360));
                assert!(svg.starts_with("<svg") && svg.contains("</svg>"), "{q} {kind}");
            }
            assert!(!d.describe().is_empty());
            assert!(d.table(&LIGHT).len() > 1, "{q} {kind}");
        }
    }
}

/// The data with what `with_current` sets cleared.
fn without_current(d: ChartData) -> ChartData {
    match d {
        ChartData::Seq(mut s) => {
            s.current = None;
            ChartData::Seq(s)
        }
        ChartData::Batch(mut b) => {
            b.current = None;
            ChartData::Batch(b)
        }
        ChartData::Gpus(mut g) => {
            g.current = None;
            ChartData::Gpus(g)
        }
        other => other,
    }
}

#[test]
fn a_configuration_and_its_sweep_key_give_the_same_chart() {
    // The app memoizes sweeps on the key: it must lose nothing the chart depends on.
    for q in [
        "seq=8192&unit=gib",
        "batch=4&seq=1024",
        "gpus=8&zero=2",
        "gpus=16&zero=full_shard",
        "gpus=8&zero=3",
        "seq=2048&attn=eager",
        "model=llama-3.1-70b&gpus=64&tp=8&pp=2&zero=1",
        "model=mixtral-8x7b-v0.1&gpus=8&ep=8&zero=3",
    ] {
        let c = cfg(q);
        for kind in ChartKind::ALL {
            let k = sweep_key(kind, &c);
            let e = estimate(&c).ok();
            assert!(chart_data(kind, &k).is_ok(), "{q} {kind}: the key of a valid configuration is valid");
            let from_key = chart_data(kind, &k).map(|d| without_current(d.with_current(&c, e.as_ref())));
            let direct = chart_data(kind, &c).map(|d| without_current(d.with_current(&c, e.as_ref())));
            assert_eq!(from_key, direct, "{q} {kind}");
        }
    }
    // And the key ignores what only moves the marker.
    assert_eq!(sweep_key(ChartKind::Seq, &cfg("seq=2048")), sweep_key(ChartKind::Seq, &cfg("seq=16384&unit=gib")));
    assert_eq!(sweep_key(ChartKind::Batch, &cfg("batch=2")), sweep_key(ChartKind::Batch, &cfg("batch=16")));
    assert_eq!(sweep_key(ChartKind::Gpus, &cfg("gpus=8&zero=3")), sweep_key(ChartKind::Gpus, &cfg("gpus=64&zero=1")));
    assert_ne!(sweep_key(ChartKind::Seq, &cfg("seq=2048")), sweep_key(ChartKind::Seq, &cfg("seq=2048&attn=eager")));
}

#[test]
fn the_unit_follows_the_configuration_without_a_new_sweep() {
    let c = cfg("unit=gib");
    let d = chart_data(ChartKind::Batch, &sweep_key(ChartKind::Batch, &c)).expect("valid");
    assert_eq!(d.unit(), Unit::Gb);
    assert_eq!(d.with_current(&c, None).unit(), Unit::Gib);
}

#[test]
fn the_charts_bracketed_searches_agree_with_plain_binary_searches() {
    use trainmem::estimator::sweep::{max_batch, max_seq, min_gpus};
    for q in
        ["", "model=qwen2.5-0.5b&attn=eager&gpu=h200", "model=llama-3.2-1b&seq=16384&gpu=a100-40gb", "model=mistral-7b-v0.1&zero=3&gpus=8"]
    {
        let c = cfg(q);
        let s = seq_data(&c);
        assert_eq!(s.sweep.limit, max_seq(&c, 1, s.sweep.range.1), "{q}: longest sequence");
        assert_eq!(batch_data(&c).sweep.limit, max_batch(&c), "{q}: largest micro-batch");
        let g = gpus_data(&c);
        let top = *g.sweep.gpus.last().expect("points");
        for l in &g.sweep.lines {
            assert_eq!(l.fewest, min_gpus(&c, l.zero, top), "{q}: fewest GPUs under {:?}", l.zero);
        }
    }
}

#[test]
fn no_legend_note_or_title_overlaps_another_or_the_plot_area_from_320_to_1600_pixels() {
    for q in ["", "model=qwen2.5-0.5b&attn=eager&gpu=h200", "model=llama-3.1-70b&gpus=64&tp=8&pp=2&zero=1&gpu=custom&gpu_gib=48"] {
        let c = cfg(q);
        let e = estimate(&c).ok();
        for kind in ChartKind::ALL {
            let d = chart_data(kind, &c).expect("valid").with_current(&c, e.as_ref());
            for theme in [LIGHT, PROJECTOR] {
                for width in (320..=1600).step_by(40) {
                    let height = d.height(width, &theme);
                    let (_, layout) = draw_scene((width, height), |root| d.draw(root, &theme).expect("draws").1);
                    assert_eq!(layout.problems(), Vec::<String>::new(), "{q} {kind} at {width} px");
                    let plot = layout.plot;
                    assert!(plot.y1 - plot.y0 >= 200, "{q} {kind} at {width} px: a plot {} px high", plot.y1 - plot.y0);
                    assert!(layout.parts.iter().any(|p| p.part == trainmem::plots::draw::Part::Legend));
                }
            }
        }
    }
}

#[test]
fn the_layout_reads_as_json_for_the_browser_tests() {
    let c = Config::default();
    let d = chart_data(ChartKind::Seq, &c).expect("valid");
    let (_, layout) = draw_scene(SIZE, |root| d.draw(root, &LIGHT).expect("draws").1);
    let json = layout.json();
    let v: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
    assert_eq!(v["w"], 960);
    assert_eq!(v["plot"].as_array().map(Vec::len), Some(4));
    let parts = v["parts"].as_array().expect("parts");
    assert!(parts.iter().any(|p| p["part"] == "legend" && p["text"] == "Activations"));
    assert!(parts.iter().any(|p| p["part"] == "title"));
}

#[test]
fn the_op_level_timeline_shades_reserved_memory_above_allocated_and_names_the_peak_op() {
    let c = cfg("seq=2048");
    let e = trainmem::estimator::explain(&c).expect("valid");
    let t = trainmem::estimator::reserve::step_trace(&c, trainmem::estimator::stream_at(&c).expect("valid"), 300).expect("valid");
    let d = trainmem::plots::timeline::trace_data(&t, &e, &c);
    // The allocated peak of the trace, with what lives outside the allocator, is the estimate's
    // peak; reserved is drawn above it and peaks at the nvidia-smi figure of the steady state.
    assert_eq!(d.peak_bytes(), e.memory.peak);
    let reserved = d.reserved_peak().expect("kernels=cuda replays the allocator");
    assert!(reserved >= d.peak_bytes());
    assert!(reserved <= e.memory.nvidia_smi.expect("explained"));
    let text = d.peak_text();
    // "Peak 91.2 GB allocated at layer 31 backward, `mlp.down_proj` …; 93.0 GB reserved".
    assert!(text.contains("allocated at ") && text.contains(" reserved"), "{text}");
    assert!(text.contains(&t.points[t.peak].label), "{text}");
    let svg = ChartData::Timeline(d.clone()).svg(&LIGHT, SIZE);
    assert!(svg.contains("Reserved by the caching allocator (simulated)"));
    assert!(svg.contains("<polygon"), "the reserved band");
    let csv = ChartData::Timeline(d).csv();
    assert!(csv.lines().next().expect("header").contains("reserved_bytes"), "{}", csv.lines().next().unwrap_or_default());
}

// The stacked bar, drawn from the default configuration's estimate.

#[test]
fn the_bar_has_a_segment_and_a_legend_entry_per_category() {
    let e = estimate(&Config::default()).expect("valid");
    let data = bar_data(&e, Unit::Gb, "H100 80 GB");
    let svg = bar_svg(&data, &LIGHT, 720);
    for s in &data.segments {
        assert!(svg.contains(&s.label), "legend lacks {}", s.label);
        assert!(svg.contains(&hex(s.color).to_uppercase()) || svg.contains(&hex(s.color)), "no fill for {}", s.label);
    }
    assert!(svg.contains("H100 80 GB: 85.52 GB"), "capacity label");
    assert!(svg.contains("memory per GPU (GB)"));
}

#[test]
fn the_segments_add_up_to_the_ledger_total() {
    let e = estimate(&Config::default()).expect("valid");
    assert_eq!(bar_data(&e, Unit::Gib, "x").total(), e.memory.total);
}

#[test]
fn the_legend_and_the_capacity_label_never_overlap_each_other_or_the_bar_from_320_to_1600_pixels() {
    for q in [Config::default(), Config { gpus: 8, zero: Zero::Z3, ..Config::default() }] {
        let e = estimate(&q).expect("valid");
        let data = bar_data(&e, Unit::Gb, "NVIDIA H100 80 GB (SXM)");
        for theme in [LIGHT, PROJECTOR] {
            for width in (320..=1600).step_by(10) {
                let height = bar_height(&data, width, &theme);
                let mut layout = None;
                let _ = svg_of((width, height), |root| {
                    layout = Some(draw_bar(root, &data, &theme)?);
                    Ok(())
                });
                let layout = layout.expect("drawn");
                assert_eq!(layout.problems(), Vec::<String>::new(), "at {width} px");
                assert!(layout.parts.iter().filter(|p| p.part == Part::Legend).count() >= data.segments.len());
            }
        }
    }
}

#[test]
fn a_compared_configuration_is_drawn_over_the_chart_as_a_dashed_line() {
    let a = decode_query("model=llama-3.1-8b&attn=eager").config;
    let b = decode_query("model=llama-3.1-8b&attn=sdpa").config;
    let chart = |c: &Config| chart_data(ChartKind::Seq, c).expect("sweeps");
    let b_series = chart(&b).overlay_series().expect("a sweep has a peak");
    assert!(b_series.iter().any(|(_, v)| v.is_some()));
    let plain = chart(&a).svg(&LIGHT, (800, 500));
    let compared = svg_of((800, 500), |root| chart(&a).draw_compared(root, &LIGHT, &b_series).map(|_| ()));
    let vermillion = |svg: &str| svg.to_ascii_lowercase().matches("#d55e00").count();
    assert!(vermillion(&compared) > vermillion(&plain), "B's line is drawn");
    assert!(!plain.contains("B peak"));
    assert!(compared.contains("B peak"));
    // The timeline has no overlay (its events differ between configurations).
    let e = estimate(&a).expect("estimates");
    assert_eq!(ChartData::timeline(&e, &a).overlay_series(), None);
}

/// The tick labels a layout reports under its plot (x) and left of it (y).
fn tick_labels(layout: &trainmem::plots::Layout) -> (Vec<String>, Vec<String>) {
    let p = layout.plot;
    let of = |f: &dyn Fn(&trainmem::plots::draw::Placed) -> bool| {
        layout.parts.iter().filter(|q| q.part == Part::Axis && f(q)).map(|q| q.text.clone()).collect::<Vec<_>>()
    };
    (of(&|q| q.rect.y0 == p.y1 + 8), of(&|q| q.rect.x1 == p.x0 - 8))
}

#[test]
fn every_axis_keeps_three_labelled_ticks_and_every_label_stays_in_the_drawing_at_phone_tablet_and_desktop_widths() {
    // The default (whose sequence chart's peak runs past the cut axis), a small model, a
    // pipeline on a custom card, and a LoRA run on a 24 GB card.
    for q in [
        "",
        "model=qwen2.5-0.5b&attn=eager&gpu=h200",
        "model=llama-3.1-70b&gpus=64&tp=8&pp=2&zero=1&gpu=custom&gpu_gib=48",
        "finetune=lora&gpu=rtx-4090",
    ] {
        let c = cfg(q);
        let e = estimate(&c).ok();
        for kind in ChartKind::ALL {
            let d = chart_data(kind, &c).expect("valid").with_current(&c, e.as_ref());
            for width in [390, 700, 1400] {
                let height = d.height(width, &LIGHT);
                let (_, layout) = draw_scene((width, height), |root| d.draw(root, &LIGHT).expect("draws").1);
                assert_eq!(layout.problems(), Vec::<String>::new(), "{q} {kind} at {width} px");
                let (x, y) = tick_labels(&layout);
                assert!(x.len() >= 3, "{q} {kind} at {width} px: x ticks {x:?}");
                assert!(y.len() >= 3, "{q} {kind} at {width} px: y ticks {y:?}");
            }
        }
    }
}

#[test]
fn a_y_axis_cut_below_the_peak_says_so_on_the_plot() {
    // Llama 3.1 8B on an H100: at 131,072 tokens the peak is ~1.2 TB; the axis stops near twice
    // the card.
    let c = cfg("");
    let d = chart_data(ChartKind::Seq, &c).expect("valid");
    let (_, layout) = draw_scene((900, d.height(900, &LIGHT)), |root| d.draw(root, &LIGHT).expect("draws").1);
    let note = layout.parts.iter().find(|p| p.part == Part::Label && p.text.contains("axis cut at"));
    assert!(note.is_some_and(|n| n.text.contains("the peak") && n.text.contains("reaches")), "{:?}", layout.parts);
    // The timeline's axis holds its every point: no such note.
    let d = chart_data(ChartKind::Timeline, &c).expect("valid");
    let (_, layout) = draw_scene((900, d.height(900, &LIGHT)), |root| d.draw(root, &LIGHT).expect("draws").1);
    assert!(!layout.parts.iter().any(|p| p.text.contains("axis cut")));
}

#[test]
fn the_recipe_comparison_draws_a_named_line_and_a_csv_column_per_recipe() {
    let c = cfg("model=llama-3.2-1b&gpus=1");
    let key = sweep::key(sweep::Axis::Seq, &c);
    let d = SeqData::new(sweep::seq_sweep(&key).with_recipes(&key), &c);
    let svg = seq_svg(&d, &LIGHT, SIZE);
    for text in ["Op-level SAC (recompute=op)", "Full recomputation (recompute=full)", "torch.compile, no recomputation (compile=true)"] {
        assert!(svg.contains(text), "no legend entry {text}");
    }
    // Each line is named where it ends inside the frame.
    for name in ["op", "full", "compile"] {
        assert!(has_text(&svg, name), "no label {name} in {:?}", texts(&svg));
    }
    let table = d.table(&LIGHT);
    let keys: Vec<&str> = table.columns.iter().map(|c| c.key.as_str()).collect();
    for k in ["peak_recipe_op_bytes", "peak_recipe_full_bytes", "peak_recipe_compile_bytes"] {
        assert!(keys.contains(&k), "{keys:?}");
    }
    assert!(d.describe().contains("Compared: Op-level SAC"), "{}", d.describe());
    // Without the comparison, none of it.
    let plain = seq_svg(&seq_data(&key), &LIGHT, SIZE);
    assert!(!plain.contains("recompute=op") && !has_text(&plain, "full"));
}
