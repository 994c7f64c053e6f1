//! "Verify on your GPU" end to end: the config.json export against the importer and against
//! transformers itself, the generated script against Python's compiler for every preset and a
//! spread of recipes, and — where torch is installed — the script run on the CPU for tiny models,
//! its JSON read back by `trainmem compare`.
//!
//! The Python checks look for an interpreter with torch and transformers in `TRAINMEM_PYTHON`,
//! then `validation/.venv/bin/python`, then `python3`; without one they print why they skip.

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use trainmem::config::{self, Config};
use trainmem::estimator::hf_export::{self, export};
use trainmem::estimator::hf_fields::python_json;
use trainmem::estimator::{hf, presets};
use trainmem::verify::{self, CUDA_ONLY, FIELDS, OFFLOAD_ONLY};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A fresh scratch directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("trainmem-verify-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}

/// An interpreter that imports torch and transformers, if there is one.
fn torch_python() -> Option<&'static str> {
    static FOUND: OnceLock<Option<String>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            let venv = root().join("validation/.venv/bin/python");
            let candidates = [std::env::var("TRAINMEM_PYTHON").ok(), Some(venv.to_string_lossy().into_owned()), Some("python3".into())];
            candidates
                .into_iter()
                .flatten()
                .find(|py| Command::new(py).args(["-c", "import torch, transformers"]).output().is_ok_and(|o| o.status.success()))
        })
        .as_deref()
}

fn skip(test: &str) -> bool {
    if torch_python().is_none() {
        // Under CI (`CI=1`, set by `.ci/run`) torch is installed by scripts/setup.sh: a test that
        // cannot run there fails instead of passing unseen.
        assert!(
            !std::env::var("CI").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true")),
            "{test}: no Python with torch and transformers under CI=1 (tried TRAINMEM_PYTHON, validation/.venv/bin/python, python3)"
        );
        println!("{test}: skipped — no Python with torch and transformers (tried TRAINMEM_PYTHON, validation/.venv/bin/python, python3)");
        return true;
    }
    false
}

fn trainmem(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_trainmem")).args(args).output().expect("the binary runs");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Every config of `tests/fixtures/hf/expected.json` (name, parsed file): the checkpoints the
/// importer reads (`expected-next.json` lists those of architectures still being added).
fn hf_fixtures() -> Vec<(String, Value)> {
    let dir = root().join("tests/fixtures/hf");
    let listed: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).expect("expected.json")).expect("a list");
    let mut out: Vec<(String, Value)> = listed
        .iter()
        .filter_map(|e| e["file"].as_str())
        .map(|name| {
            let text = std::fs::read_to_string(dir.join(name)).expect("readable fixture");
            // Read as the importer reads it: Python's `json` writes `Infinity` (Falcon-H1's time_step_limit).
            let text = python_json(&text).expect("fixture is Python's JSON");
            (name.to_string(), serde_json::from_str(&text).expect("JSON fixture"))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The text model type a fixture's class builds (a wrapper's `text_config`, Kimi K2 as DeepSeek-V3).
fn text_model_type(file: &Value) -> String {
    let t = file["model_type"].as_str().unwrap_or_default();
    let t = match hf::MULTIMODAL.iter().find(|(w, _)| *w == t) {
        Some((_, default)) => file["text_config"]["model_type"].as_str().unwrap_or(default),
        None => t,
    };
    if t == "kimi_k2" { "deepseek_v3" } else { t }.to_string()
}

// ---- The export --------------------------------------------------------------------------------

#[test]
fn every_hf_fixture_exports_as_its_own_model_type_and_reads_back_equal() {
    let fixtures = hf_fixtures();
    assert!(fixtures.len() >= 60, "the fixtures are there");
    let mut types: Vec<String> = Vec::new();
    let mut failures = Vec::new();
    for (name, file) in &fixtures {
        let spec = hf::import_value(file).unwrap_or_else(|e| panic!("{name}: {e}")).spec;
        let want = text_model_type(file);
        match export(&spec) {
            Ok(e) => {
                let back = hf::import_value(&e.config).map(|i| i.spec);
                if back.as_ref() != Ok(&spec) {
                    failures.push(format!("{name}: the export does not read back equal"));
                }
                if e.model_type != want {
                    failures.push(format!("{name}: exported as {} rather than {want}", e.model_type));
                }
                types.push(e.model_type.to_string());
            }
            Err(err) => failures.push(format!("{name}: {err}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    types.sort();
    types.dedup();
    println!("{} fixtures round-trip through {} model types: {}", fixtures.len(), types.len(), types.join(", "));
    for t in hf_export::exportable() {
        assert!(types.iter().any(|x| x == t), "no fixture exercises the {t} writer");
    }
}

#[test]
fn every_preset_exported_builds_its_exact_parameter_count_in_transformers() {
    if skip("every_preset_exported_builds_its_exact_parameter_count_in_transformers") {
        return;
    }
    let all = presets::presets();
    let items: Vec<Value> = all
        .iter()
        .map(|p| {
            let config = hf_export::to_config_json(&p.spec).unwrap_or_else(|e| panic!("{}: {e}", p.id));
            json!({"id": p.id, "config": config})
        })
        .collect();
    let dir = scratch("meta");
    let (script, input) = (dir.join("meta_count.py"), dir.join("items.json"));
    std::fs::write(&script, META_COUNT).expect("write helper");
    std::fs::write(&input, Value::Array(items).to_string()).expect("write items");
    let py = torch_python().unwrap_or("python3");
    let out = Command::new(py).arg(&script).stdin(std::fs::File::open(&input).expect("items")).output().expect("python runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The helper echoes configs through Python's `json`, which writes `Infinity`.
    let printed = python_json(&String::from_utf8_lossy(&out.stdout)).expect("the helper prints Python's JSON");
    let results: Vec<Value> = serde_json::from_str(&printed).expect("the helper prints JSON");
    assert_eq!(results.len(), all.len());
    let mut failures = Vec::new();
    for (p, r) in all.iter().zip(&results) {
        if let Some(err) = r["error"].as_str() {
            failures.push(format!("{}: transformers refuses the export: {err}", p.id));
            continue;
        }
        let built = r["parameter_count"].as_u64();
        if built != Some(p.spec.counts().total) {
            failures.push(format!("{}: transformers builds {built:?} parameters, the preset counts {}", p.id, p.spec.counts().total));
        }
        // transformers' own serialisation of the config it built (every default resolved, keys
        // standardised) must read back as the same architecture: no key was ignored.
        match hf::import_value(&r["config"]) {
            Ok(i) if i.spec == p.spec => {}
            Ok(_) => failures.push(format!("{}: transformers' config.to_dict() reads back as another architecture", p.id)),
            Err(e) => failures.push(format!("{}: transformers' config.to_dict() does not import: {e}", p.id)),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    println!("{} presets: transformers builds each export with the preset's exact parameter count", all.len());
}

/// Builds configs on the meta device: stdin a JSON list of {id, config}; stdout a list of
/// {id, parameter_count, config (config.to_dict())} or {id, error}.
const META_COUNT: &str = r#"
import json, sys, warnings
import torch
from transformers import AutoConfig, AutoModelForCausalLM

out = []
for item in json.load(sys.stdin):
    raw = dict(item["config"])
    try:
        config = AutoConfig.for_model(raw.pop("model_type"), **raw)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(config)
        count = sum(p.numel() for p in model.parameters())
        back = json.loads(json.dumps(model.config.to_dict(), default=str))
        out.append({"id": item["id"], "parameter_count": count, "config": back})
        del model
    except Exception as e:
        out.append({"id": item["id"], "error": f"{type(e).__name__}: {e}"})
json.dump(out, sys.stdout)
"#;

// ---- The script ---------------------------------------------------------------------------------

/// Compiles every file with `python3 -m py_compile` (one interpreter for all).
fn py_compile(files: &[PathBuf]) {
    let out = Command::new("python3").arg("-m").arg("py_compile").args(files).output().expect("python3 runs");
    assert!(out.status.success(), "py_compile: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn every_preset_gets_a_script_that_python_compiles() {
    let dir = scratch("presets");
    let mut files = Vec::new();
    let mut unestimated = Vec::new();
    for p in presets::presets() {
        let mut cfg = Config::default();
        config::set(&mut cfg, "model", p.id).expect("preset id");
        let script = verify::verify_script(&cfg).unwrap_or_else(|e| panic!("{}: {e}", p.id));
        if trainmem::estimator::estimate(&cfg).is_err() {
            // Still generated: the script measures, with null predictions and a note saying why.
            assert!(script.contains("trainmem does not estimate this architecture yet"), "{}", p.id);
            unestimated.push(p.id);
        } else {
            assert!(!script.contains("\"cuda\": null"), "{}: predictions embedded", p.id);
        }
        let f = dir.join(format!("{}.py", p.id.replace('.', "_")));
        std::fs::write(&f, script).expect("write script");
        files.push(f);
    }
    py_compile(&files);
    println!("{} preset scripts compile; generated without predictions (not estimated yet): {}", files.len(), unestimated.join(", "));
}

#[test]
fn a_spread_of_recipes_attention_and_checkpointing_compiles() {
    let dir = scratch("spread");
    let mut files = Vec::new();
    let models = ["gpt2", "llama-3.2-1b", "qwen3-30b-a3b", "gemma-2-2b", "phi-3-mini-4k-instruct", "mixtral-8x7b-v0.1"];
    let recipes = [
        ("fp32", "forloop", "adamw"),
        ("bf16", "foreach", "adamw"),
        ("fp16", "fused", "sgd"),
        ("amp-bf16", "fused", "momentum"),
        ("amp-fp16", "foreach", "adafactor"),
        ("mixed-bf16", "fused", "adamw"),
        ("mixed-fp16", "forloop", "adamw"),
        ("mixed-bf16-fp32grad", "foreach", "adamw"),
    ];
    for model in models {
        for (i, (precision, imp, optim)) in recipes.iter().enumerate() {
            let attn = ["eager", "sdpa", "flash"][i % 3];
            let recompute = ["none", "full"][i % 2];
            // Offloading where nothing is checkpointed (the estimate refuses the two together).
            let offload = if recompute == "none" { ["torchtune", "save_on_cpu"][(i / 2) % 2] } else { "none" };
            let q = format!(
                "model={model}&precision={precision}&optim_impl={imp}&optim={optim}&attn={attn}&recompute={recompute}&seq=512&batch=2&accum={}&dropout={}&act_offload={offload}",
                1 + i % 2,
                if i % 3 == 0 { "0.1" } else { "0" }
            );
            let d = config::decode_query(&q);
            assert!(d.errors.is_empty(), "{q}: {:?}", d.errors);
            let script = verify::verify_script(&d.config).unwrap_or_else(|e| panic!("{q}: {e}"));
            let f = dir.join(format!("{}-{i}.py", model.replace('.', "_")));
            std::fs::write(&f, script).expect("write script");
            files.push(f);
        }
    }
    py_compile(&files);
}

#[test]
fn the_embedded_tracker_is_validations_own_and_python() {
    let path = root().join("validation/tracker.py");
    py_compile(std::slice::from_ref(&path));
    assert_eq!(std::fs::read_to_string(&path).expect("validation/tracker.py"), verify::TRACKER);
}

#[test]
fn the_cli_writes_the_script_to_a_file_or_stdout_and_refuses_by_key() {
    let dir = scratch("cli");
    let out = dir.join("v.py");
    let (code, text, err) = trainmem(&["verify-script", "--model", "gpt2", "--precision", "fp32", "--out", out.to_str().expect("utf-8")]);
    assert_eq!(code, 0, "{err}");
    assert!(text.starts_with("wrote ") && out.exists(), "{text}");
    let (code, text, _) = trainmem(&["verify-script", "--model", "qwen2.5-0.5b", "--seq", "1024"]);
    assert_eq!(code, 0);
    assert!(text.starts_with("#!/usr/bin/env python3") && text.contains("\"model_type\": \"qwen2\""));
    let (code, _, err) = trainmem(&["verify-script", "--model", "gpt2", "--gpus", "8"]);
    assert_eq!(code, 1);
    assert!(err.contains("`gpus` = 8: the script runs one process on one device"), "{err}");
    let (code, _, err) = trainmem(&["compare", dir.join("missing.json").to_str().expect("utf-8")]);
    assert_eq!(code, 1);
    assert!(err.contains("cannot read"), "{err}");
    std::fs::write(dir.join("bad.json"), "{\"schema\": \"trainmem-verify\", \"version\": 1}").expect("write");
    let (code, _, err) = trainmem(&["compare", dir.join("bad.json").to_str().expect("utf-8")]);
    assert_eq!(code, 1);
    assert!(err.contains("`query` must be a string"), "{err}");
}

#[test]
fn an_imported_configs_model_type_is_kept_by_the_export() {
    // A Mistral checkpoint without a window is Llama-shaped; its family keeps it a mistral.
    let dir = scratch("hint");
    let cfg = dir.join("config.json");
    std::fs::write(
        &cfg,
        r#"{"model_type": "mistral", "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "intermediate_size": 176, "sliding_window": null}"#,
    )
    .expect("write");
    let (code, text, err) = trainmem(&["verify-script", "--hf-config", cfg.to_str().expect("utf-8"), "--seq", "64"]);
    assert_eq!(code, 0, "{err}");
    assert!(text.contains("\"model_type\": \"mistral\""));
}

// ---- Running it ---------------------------------------------------------------------------------

/// Tiny configurations (b = 1–2, s = 64) that run in seconds on a CPU.
const RUNS: &[(&str, &str)] = &[
    (
        "llama-fp32-eager",
        "model=llama-3.2-1b&vocab=1000&hidden=64&layers=2&heads=4&kv_heads=2&head_dim=16&ffn=176&max_pos=512&tied=false\
         &batch=2&seq=64&precision=fp32&attn=eager&optim_impl=forloop",
    ),
    (
        "llama-bf16-sdpa-ckpt",
        "model=llama-3.2-1b&vocab=1000&hidden=64&layers=2&heads=4&kv_heads=2&head_dim=16&ffn=176&max_pos=512&tied=false\
         &batch=2&seq=64&precision=bf16&attn=sdpa&recompute=full&optim_impl=forloop",
    ),
    ("gpt2-ampbf16-sdpa", "model=gpt2&vocab=1000&hidden=64&layers=2&heads=4&kv_heads=4&head_dim=16&ffn=176&max_pos=512&batch=1&seq=64&precision=amp-bf16&attn=sdpa&optim_impl=foreach"),
    (
        "mixtral-bf16-sdpa",
        "model=mixtral-8x7b-v0.1&vocab=1000&hidden=64&layers=2&heads=4&kv_heads=2&head_dim=16&experts=4&top_k=2&expert_ffn=40&max_pos=512\
         &batch=2&seq=64&precision=bf16&attn=sdpa&optim_impl=forloop",
    ),
    // Issue 26's recipes, on the tiny Llama: op-level SAC (the CPU's SDPA kernel saved, as the
    // records' recompute=op), every 2nd layer of 4 checkpointed, the step in backward.
    (
        "llama-op-sac",
        "model=llama-3.2-1b&vocab=1000&hidden=64&layers=2&heads=4&kv_heads=2&head_dim=16&ffn=176&max_pos=512&tied=false\
         &batch=2&seq=64&precision=fp32&attn=sdpa&optim_impl=foreach&recompute=op&sac_cpu_sdpa=true",
    ),
    // Mixtral's router divides its saved top-k values in place: the script's policy allows it.
    (
        "mixtral-op-sac",
        "model=mixtral-8x7b-v0.1&vocab=1000&hidden=64&layers=2&heads=4&kv_heads=2&head_dim=16&experts=4&top_k=2&expert_ffn=40&max_pos=512\
         &batch=2&seq=64&precision=bf16&attn=sdpa&optim_impl=forloop&recompute=op&sac_cpu_sdpa=true",
    ),
    (
        "llama-every-2",
        "model=llama-3.2-1b&vocab=1000&hidden=64&layers=4&heads=4&kv_heads=2&head_dim=16&ffn=176&max_pos=512&tied=false\
         &batch=2&seq=64&precision=bf16&attn=sdpa&optim_impl=foreach&recompute_every=2",
    ),
    (
        "llama-optim-in-bwd",
        "model=llama-3.2-1b&vocab=1000&hidden=64&layers=2&heads=4&kv_heads=2&head_dim=16&ffn=176&max_pos=512&tied=false\
         &batch=2&seq=64&precision=fp32&attn=sdpa&optim_impl=foreach&optim_in_bwd=true",
    ),
    (
        "llama-mixedbf16-fused",
        "model=llama-3.2-1b&vocab=1000&hidden=64&layers=2&heads=4&kv_heads=2&head_dim=16&ffn=176&max_pos=512&tied=false\
         &batch=2&seq=64&precision=mixed-bf16&attn=sdpa&optim_impl=fused",
    ),
];

#[test]
fn the_script_runs_on_the_cpu_and_compare_reads_its_json() {
    if skip("the_script_runs_on_the_cpu_and_compare_reads_its_json") {
        return;
    }
    let py = torch_python().unwrap_or("python3");
    let dir = scratch("runs");
    let mut report = Vec::new();
    for (name, query) in RUNS {
        let d = config::decode_query(&format!("{query}&kernels=cpu"));
        assert!(d.errors.is_empty(), "{name}: {:?}", d.errors);
        let script = dir.join(format!("{name}.py"));
        std::fs::write(&script, verify::verify_script(&d.config).unwrap_or_else(|e| panic!("{name}: {e}"))).expect("write");
        let json_path = dir.join(format!("{name}.json"));
        let started = std::time::Instant::now();
        let out = Command::new(py).arg(&script).args(["--device", "cpu", "--out"]).arg(&json_path).output().expect("python runs");
        let seconds = started.elapsed().as_secs_f64();
        assert!(
            out.status.success(),
            "{name}: the script failed\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let path = json_path.to_str().expect("utf-8");
        let (code, text, err) = trainmem(&["compare", path]);
        assert_eq!(code, 0, "{name}: {err}");
        let (code, js, err) = trainmem(&["compare", path, "--json"]);
        assert_eq!(code, 0, "{name}: {err}");
        let c: Value = serde_json::from_str(&js).expect("compare --json prints JSON");
        let rows = c["rows"].as_array().expect("rows");
        assert_eq!(rows.len(), FIELDS.len());
        for r in rows {
            let field = r["field"].as_str().unwrap_or_default();
            // None of these runs offloads activations: the host field is null too.
            let on_cpu = !CUDA_ONLY.contains(&field) && !OFFLOAD_ONLY.contains(&field);
            assert_eq!(r["measured"].is_u64(), on_cpu, "{name}: {field} measured");
            assert_eq!(r["predicted"].is_u64(), on_cpu, "{name}: {field} predicted");
            // The step model's target (issue 11): −1 %..+3 % of the tracker. The optimizer step
            // of a master-weights recipe is the script's own (it casts one gradient at a time),
            // not a recipe trainmem models: its note says so, and it is not held to the target.
            let scripted = field == "step_peak" && trainmem::estimator::precision::recipe(d.config.precision).master.is_some();
            if let (Some(m), Some(p), false) = (r["measured"].as_u64(), r["predicted"].as_u64(), scripted) {
                let rel = (p as f64 - m as f64) / m as f64;
                assert!((-0.01..=0.03).contains(&rel), "{name}: {field} predicted {p}, measured {m} ({:+.2} %)", rel * 100.0);
            }
        }
        let record: Value = serde_json::from_str(&std::fs::read_to_string(&json_path).expect("the JSON")).expect("JSON");
        assert_eq!(record["steps"].as_array().map(Vec::len), Some(3));
        assert_eq!(record["parameter_count"]["built"], record["parameter_count"]["trainmem"], "{name}: the model built is the spec");
        report.push(format!("== {name} ({seconds:.1} s)\n{text}"));
    }
    println!("{}", report.join("\n"));
}

#[test]
fn committed_cpu_measurements_compare_exactly_with_todays_estimate() {
    // tests/fixtures/verify/gpt2-ampbf16-sdpa.cpu.json: the script's JSON (version 1, the model
    // built in place) from a CPU run (torch 2.15, transformers 5.24); …-from-pretrained.cpu.json:
    // version 2, the same configuration loaded through from_pretrained with empty_cache=true.
    // Every field the tracker measures is predicted to the byte.
    for (file, version) in [("gpt2-ampbf16-sdpa.cpu.json", 1), ("gpt2-ampbf16-sdpa-from-pretrained.cpu.json", 2)] {
        let path = root().join("tests/fixtures/verify").join(file);
        let record: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("the record")).expect("JSON");
        assert_eq!(record["version"], version, "{file}");
        let (code, js, err) = trainmem(&["compare", path.to_str().expect("utf-8"), "--json"]);
        assert_eq!(code, 0, "{file}: {err}");
        let c: Value = serde_json::from_str(&js).expect("json");
        let mut measured = Vec::new();
        for r in c["rows"].as_array().expect("rows") {
            if let (Some(m), Some(p)) = (r["measured"].as_u64(), r["predicted"].as_u64()) {
                assert_eq!(p, m, "{file}: {}", r["field"]);
                measured.push(r["field"].as_str().unwrap_or_default().to_string());
            }
        }
        assert_eq!(measured, ["after_forward", "forward_peak", "backward_peak", "step_peak", "peak"], "{file}");
    }
}

// ---- Issue 27: loading through from_pretrained, torchao's FP8 ------------------------------------

/// Runs a generated script on the CPU: (exit code, stdout, stderr).
fn run_on_cpu(py: &str, script: &Path, json_path: &Path) -> (i32, String, String) {
    let out = Command::new(py).arg(script).args(["--device", "cpu", "--out"]).arg(json_path).output().expect("python runs");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn loaded_through_from_pretrained_on_the_cpu_every_step_field_is_exact_and_the_loading_is_null() {
    if skip("loaded_through_from_pretrained_on_the_cpu_every_step_field_is_exact_and_the_loading_is_null") {
        return;
    }
    // The committed record's configuration (tests/fixtures/verify/gpt2-ampbf16-sdpa.cpu.json),
    // loaded with from_pretrained (the default, said explicitly), with empty_cache after it.
    let fixture: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/fixtures/verify/gpt2-ampbf16-sdpa.cpu.json")).expect("the committed record"),
    )
    .expect("JSON");
    let query = format!("{}&load=from-pretrained&empty_cache=true", fixture["query"].as_str().expect("query"));
    let d = config::decode_query(&query);
    assert!(d.errors.is_empty(), "{:?}", d.errors);
    let dir = scratch("from-pretrained");
    let (script, json_path) = (dir.join("load.py"), dir.join("load.json"));
    let text = verify::verify_script(&d.config).expect("renders");
    assert!(text.contains(r#""load": {"#) && text.contains(r#""empty_cache": true"#));
    std::fs::write(&script, text).expect("write");
    let (code, stdout, stderr) = run_on_cpu(torch_python().unwrap_or("python3"), &script, &json_path);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let record: Value = serde_json::from_str(&std::fs::read_to_string(&json_path).expect("the JSON")).expect("JSON");
    assert_eq!(record["version"], 2);
    assert_eq!(record["load"]["kind"], "from_pretrained");
    assert!(record["method"]["load"].as_str().is_some_and(|m| m.starts_with("AutoModelForCausalLM.from_pretrained(")));
    assert!(record["notes"]
        .as_array()
        .expect("notes")
        .iter()
        .any(|n| n.as_str().is_some_and(|n| n.contains("loaded with from_pretrained on the CPU"))));
    let (code, js, err) = trainmem(&["compare", json_path.to_str().expect("utf-8"), "--json"]);
    assert_eq!(code, 0, "{err}");
    let c: Value = serde_json::from_str(&js).expect("json");
    let mut exact = Vec::new();
    for r in c["rows"].as_array().expect("rows") {
        let field = r["field"].as_str().unwrap_or_default();
        if CUDA_ONLY.contains(&field) {
            assert!(r["measured"].is_null() && r["predicted"].is_null(), "{field}: the CPU has no caching allocator");
        } else if OFFLOAD_ONLY.contains(&field) {
            assert!(r["measured"].is_null() && r["predicted"].is_null(), "{field}: nothing is offloaded");
        } else {
            // The same bytes as the committed record, which built the model in place.
            assert_eq!(r["measured"], fixture["fields"][field]["measured"], "{field}: loading changed the step");
            assert_eq!(r["predicted"], r["measured"], "{field}");
            exact.push(field);
        }
    }
    assert_eq!(exact, ["after_forward", "forward_peak", "backward_peak", "step_peak", "peak"]);
}

/// A tiny Llama with torchao's FP8 (its projections 64 -> 64/32/176: all multiples of 16).
const FP8_LLAMA: &str = "model=llama-3.2-1b&vocab=1000&hidden=64&layers=2&heads=4&kv_heads=2&head_dim=16&ffn=176&max_pos=512&tied=false\
                         &batch=2&seq=64&precision=bf16&attn=sdpa&optim_impl=foreach&kernels=cpu";

#[test]
fn the_fp8_scripts_compile_and_convert_exactly_trainmems_linears_with_torchao() {
    let dir = scratch("fp8");
    let mut files = Vec::new();
    for (recipe, recompute) in [("tensorwise", false), ("rowwise", true)] {
        let q = format!("{FP8_LLAMA}&fp8=torchao-{recipe}&fp8_recompute_weight={recompute}");
        let d = config::decode_query(&q);
        assert!(d.errors.is_empty(), "{q}: {:?}", d.errors);
        let s = verify::verify_script(&d.config).unwrap_or_else(|e| panic!("{q}: {e}"));
        for needle in [
            "from torchao.float8 import Float8LinearConfig, convert_to_float8_training",
            "Float8LinearConfig.from_recipe_name(fp8[\"recipe\"])",
            "force_recompute_fp8_weight_in_bwd=True",
            "convert_to_float8_training(model, module_filter_fn=lambda m, fqn: fqn in chosen, config=config)",
            "if tuple(cc) < (8, 9):",
            &format!("\"recipe\": \"{recipe}\""),
            &format!("\"recompute_weight\": {recompute}"),
            "\"mlp.down_proj\"",
        ] {
            assert!(s.contains(needle), "{recipe}: the script lacks {needle}");
        }
        let f = dir.join(format!("fp8-{recipe}.py"));
        std::fs::write(&f, s).expect("write");
        files.push(f);
    }
    // Full-size presets: dense, MoE (experts are not nn.Linear: only attention converts), fused
    // projections, MLA.
    let mut presets_fp8 = Vec::new();
    for model in ["llama-3.2-1b", "qwen3-30b-a3b", "phi-3-mini-4k-instruct", "gemma-2-2b", "deepseek-v3"] {
        let d = config::decode_query(&format!("model={model}&precision=bf16&seq=1024&fp8=torchao-rowwise"));
        assert!(d.errors.is_empty(), "{model}: {:?}", d.errors);
        let linears = verify::fp8_linears(&d.config);
        assert_eq!(linears.len() as u64, d.config.arch.layers, "{model}");
        assert!(linears.iter().all(|l| l.iter().any(|m| m.ends_with("o_proj"))), "{model}: {linears:?}");
        let f = dir.join(format!("fp8-{}.py", model.replace('.', "_")));
        std::fs::write(&f, verify::verify_script(&d.config).unwrap_or_else(|e| panic!("{model}: {e}"))).expect("write");
        presets_fp8.push(f);
    }
    py_compile(&presets_fp8);
    py_compile(&files);
    if skip("the_fp8_scripts_compile_and_convert_exactly_trainmems_linears_with_torchao") {
        return;
    }
    let py = torch_python().unwrap_or("python3");
    // On the CPU the script refuses FP8 at run time, naming the key, before it builds anything.
    let (code, _, err) = run_on_cpu(py, &files[0], &dir.join("fp8.json"));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("`fp8` = torchao-tensorwise: the script measures FP8 on CUDA only"), "{err}");
    // The filter itself needs no torchao: the loaded model's linears it picks are exactly the
    // ones trainmem's step program runs as Float8Linear, and a GPT-2 (Conv1D, which torchao
    // does not convert) is refused rather than measured as something else.
    let gpt2 = config::decode_query(
        "model=gpt2&vocab=1000&hidden=64&layers=2&heads=4&kv_heads=4&head_dim=16&ffn=176&max_pos=512&batch=1&seq=64\
         &precision=bf16&fp8=torchao-tensorwise&kernels=cpu",
    );
    let g = dir.join("fp8-gpt2.py");
    std::fs::write(&g, verify::verify_script(&gpt2.config).expect("renders")).expect("write");
    let probe = dir.join("probe.py");
    std::fs::write(&probe, FP8_PROBE).expect("write");
    let out = Command::new(py).arg(&probe).arg(&files[1]).arg(&g).output().expect("python runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got: Value = serde_json::from_str(&String::from_utf8_lossy(&out.stdout)).expect("the probe prints JSON");
    let want: Vec<String> = (0..2)
        .flat_map(|i| {
            [
                "self_attn.q_proj",
                "self_attn.k_proj",
                "self_attn.v_proj",
                "self_attn.o_proj",
                "mlp.gate_proj",
                "mlp.up_proj",
                "mlp.down_proj",
            ]
            .map(|m| format!("model.layers.{i}.{m}"))
        })
        .collect();
    assert_eq!(got[0], json!(want));
    assert!(got[1].as_str().is_some_and(|e| e.contains("is a Conv1D")), "{}", got[1]);
}

/// Loads each script given as a module, loads its model on the CPU and prints the FP8
/// selection (a list of names, or the refusal's text).
const FP8_PROBE: &str = r#"
import importlib.util, json, sys, torch
out = []
for path in sys.argv[1:]:
    spec = importlib.util.spec_from_file_location("verify_script", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model, _ = mod.load_model(torch, "cpu")
    try:
        out.append(mod.fp8_selection(torch, model))
    except mod.Refused as e:
        out.append(str(e))
print(json.dumps(out))
"#;

// ---- Issue 26: activation offloading ------------------------------------------------------------

/// The tiny Llama of `RUNS` (fp32, SDPA), with activation offloading.
const OFFLOAD_LLAMA: &str =
    "model=llama-3.2-1b&vocab=1000&hidden=64&layers=2&heads=4&kv_heads=2&head_dim=16&ffn=176&max_pos=512&tied=false\
                             &batch=2&seq=64&precision=fp32&attn=sdpa&optim_impl=foreach&kernels=cpu";

#[test]
fn offloading_activations_on_the_cpu_every_device_field_and_the_host_bytes_are_exact() {
    if skip("offloading_activations_on_the_cpu_every_device_field_and_the_host_bytes_are_exact") {
        return;
    }
    // torchtune's OffloadActivations (the script's CPU port: streams no-ops, host copies outside
    // the tracker) around the model call with the head under a NoOpManager and the loss outside;
    // save_on_cpu around the model call with transformers' loss inside. Llama's host bytes are
    // exact in the recipe records (tests/recipe_fixtures.rs lists no residual for it).
    let py = torch_python().unwrap_or("python3");
    let dir = scratch("offload");
    for kind in ["torchtune", "save_on_cpu"] {
        let d = config::decode_query(&format!("{OFFLOAD_LLAMA}&act_offload={kind}"));
        assert!(d.errors.is_empty(), "{kind}: {:?}", d.errors);
        let (script, json_path) = (dir.join(format!("{kind}.py")), dir.join(format!("{kind}.json")));
        let text = verify::verify_script(&d.config).unwrap_or_else(|e| panic!("{kind}: {e}"));
        assert!(text.contains(&format!(r#""act_offload": "{kind}""#)), "{kind}");
        std::fs::write(&script, text).expect("write");
        let (code, stdout, stderr) = run_on_cpu(py, &script, &json_path);
        assert_eq!(code, 0, "{kind}: {stdout}\n{stderr}");
        let record: Value = serde_json::from_str(&std::fs::read_to_string(&json_path).expect("the JSON")).expect("JSON");
        assert_eq!(record["act_offload"]["kind"], kind);
        // Every step copies the same bytes to the host, and backward frees every copy.
        for step in record["steps"].as_array().expect("steps") {
            assert_eq!(step["host_offloaded"], record["fields"]["host_offloaded"]["measured"], "{kind}");
            assert_eq!(step["host_live_after_step"], 0, "{kind}: a host copy outlived the step");
        }
        let (code, js, err) = trainmem(&["compare", json_path.to_str().expect("utf-8"), "--json"]);
        assert_eq!(code, 0, "{kind}: {err}");
        let c: Value = serde_json::from_str(&js).expect("json");
        let mut exact = Vec::new();
        for r in c["rows"].as_array().expect("rows") {
            let field = r["field"].as_str().unwrap_or_default();
            if CUDA_ONLY.contains(&field) {
                assert!(r["measured"].is_null() && r["predicted"].is_null(), "{kind}: {field}");
                continue;
            }
            assert!(r["measured"].as_u64().is_some_and(|m| m > 0), "{kind}: {field} measured");
            assert_eq!(r["predicted"], r["measured"], "{kind}: {field}");
            exact.push(field);
        }
        assert_eq!(exact, ["after_forward", "forward_peak", "backward_peak", "step_peak", "peak", "host_offloaded"], "{kind}");
        println!("{kind}: {stdout}");
    }
}
