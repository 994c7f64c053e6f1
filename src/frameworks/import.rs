//! `import`: files in, a configuration and a report of every key out.

use super::report::{Format, ImportError, Imported, KeyReport, Status, Yield};
use super::tree::{self, SyntaxError};
use super::{accelerate, deepspeed, megatron, torchtitan, torchtune, trainer};
use crate::config::{self, Config};
use serde_json::Value;

/// Reads framework config files (name, text) into one configuration: trainmem's defaults, then
/// each file's keys, the launcher's after the script's and DeepSpeed's last (a Trainer JSON with
/// its DeepSpeed JSON). Each file's format is recognised from its contents.
///
/// A key whose value cannot be used is reported `invalid` (and in `errors`) and the rest of the
/// configuration is kept; a file that cannot be parsed at all is an error naming its line.
pub fn import(files: &[(&str, &str)]) -> Result<Imported, ImportError> {
    let named: Vec<(&str, &str, Option<Format>)> = files.iter().map(|(n, t)| (*n, *t, None)).collect();
    import_with(&named)
}

/// [`import`] with each file's format given (`None`: recognised from its contents).
pub fn import_with(files: &[(&str, &str, Option<Format>)]) -> Result<Imported, ImportError> {
    if files.is_empty() {
        return Err(ImportError::NoFiles);
    }
    let mut parsed = Vec::new();
    for (name, text, format) in files {
        let (format, root) = recognise(name, text, *format)?;
        parsed.push((*name, *text, format, root));
    }
    parsed.sort_by_key(|(_, _, f, _)| f.rank());
    let mut keys: Vec<KeyReport> = Vec::new();
    let mut pairs: Vec<(String, String)> = Vec::new();
    let mut errors = Vec::new();
    let mut formats = Vec::new();
    let mut yields = Vec::new();
    for (name, text, format, root) in &parsed {
        let mut st = super::report::FileState::new(name, text);
        let precision_before = pairs.iter().rev().find(|(k, _)| k == "precision").map(|(_, v)| v.clone());
        match format {
            Format::Torchtune => torchtune::read(root, &mut st),
            Format::Torchtitan => torchtitan::read(root, &mut st),
            Format::Deepspeed => deepspeed::read(root, &mut st, "", precision_before.as_deref()),
            Format::Accelerate => accelerate::read(root, &mut st),
            Format::Trainer => trainer::read_trainer(root, &mut st),
            Format::Peft => trainer::read_peft(root, &mut st),
            Format::Axolotl => trainer::read_axolotl(root, &mut st),
            Format::Litgpt => trainer::read_litgpt(root, &mut st),
            Format::MegatronBridge => megatron::read_bridge(root, &mut st),
            Format::MegatronLm => megatron::read_args(text, &mut st).map_err(|e| syntax(name, text, e))?,
        }
        formats.push((name.to_string(), *format));
        pairs.extend(st.pairs.into_iter().map(|(k, v)| (k.to_string(), v)));
        keys.extend(st.reports);
        errors.extend(st.errors);
        yields.extend(st.yields);
    }
    // A later file's setting wins; each key keeps its last value in the order it was first set.
    let mut last: Vec<(String, String)> = Vec::new();
    for (k, v) in pairs {
        last.retain(|(lk, _)| *lk != k);
        last.push((k, v));
    }
    // Enough GPUs for the model-parallel sizes the files ask for.
    let size = |k: &str| last.iter().find(|(n, _)| n == k).and_then(|(_, v)| v.parse::<u64>().ok()).unwrap_or(1).max(1);
    let need = size("tp") * size("pp") * size("cp");
    if need > size("gpus") {
        last.retain(|(k, _)| k != "gpus");
        last.push(("gpus".into(), need.to_string()));
    }
    // Values the configuration cannot hold at all (an unknown value, out of range), as against
    // settings that are each valid but that the estimator does not model together (compile of
    // checkpointed layers, a framework's own code for a recipe it was not measured with).
    let bad_values: Vec<String> = config::apply_pairs(&mut Config::default(), last.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect())
        .into_iter()
        .map(|e| e.key)
        .collect();
    yields.push(Yield::eager());
    let decoded = give_way(&mut last, &yields, &mut keys, &bad_values);
    // A setting the estimator refuses (it fell back to its default): report it on the file keys
    // that asked for it — invalid where the value itself is bad; unmodelled (the file is right,
    // the estimate keeps the default) where the combination is not modelled yet.
    for e in &decoded.errors {
        let kept = config::get(&decoded.config, &e.key).unwrap_or_default();
        for k in keys.iter_mut().filter(|k| k.set.split('&').any(|p| p.split('=').next() == Some(e.key.as_str()))) {
            if !bad_values.contains(&e.key) {
                k.status = Status::Unmodelled;
                k.note = format!("{}: trainmem keeps {}={}", e.reason, e.key, kept);
                continue;
            }
            k.status = Status::Invalid;
            k.note = format!("{} (trainmem keeps {}={})", e.reason, e.key, kept);
            errors.push(ImportError::Value {
                file: k.file.clone(),
                line: k.line,
                key: k.key.clone(),
                value: e.value.clone(),
                reason: k.note.clone(),
            });
        }
    }
    // What the configuration holds: a refused setting fell back to its default, so it is not
    // among the pairs an import applies (`apply`) or a recipe lists.
    last.retain(|(k, _)| !decoded.errors.iter().any(|e| e.key == *k));
    let query = config::encode_query(&decoded.config);
    Ok(Imported { config: decoded.config, query, keys, pairs: last, formats, errors })
}

/// Where the estimator refuses the combination the files ask for, the settings that give way
/// first, in `yields`' order (each file's own, then torch.compile): a change is made where it
/// leaves fewer refusals, and the reports of the keys that set what it changes say why (the
/// estimator's reason) and what the estimate follows instead. What is still refused after them
/// falls back key by key as the estimator names it (`config::decode_pairs`). Returns the
/// decoding of the pairs it leaves in `last`.
fn give_way(last: &mut Vec<(String, String)>, yields: &[Yield], keys: &mut [KeyReport], bad_values: &[String]) -> config::Decoded {
    let decode = |pairs: &[(String, String)]| config::decode_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    // The estimator's refusals, as against values the configuration cannot hold.
    let refusals = |d: &config::Decoded| d.errors.iter().filter(|e| !bad_values.contains(&e.key)).count();
    let mut now = decode(last);
    for y in yields {
        if refusals(&now) == 0 {
            break;
        }
        let Some(candidate) = y.apply(last) else { continue };
        let after = decode(&candidate);
        if refusals(&after) >= refusals(&now) {
            continue;
        }
        let lifted = now
            .errors
            .iter()
            .filter(|e| !bad_values.contains(&e.key))
            .find(|e| !after.errors.iter().any(|a| a.key == e.key && a.reason == e.reason))
            .or_else(|| now.errors.iter().find(|e| !bad_values.contains(&e.key)));
        let reason = lifted.map(|e| e.reason.as_str()).unwrap_or_default();
        let touched: Vec<&str> = y.keys().collect();
        for k in keys.iter_mut().filter(|k| k.set.split('&').any(|p| p.split('=').next().is_some_and(|key| touched.contains(&key)))) {
            let kept: Vec<&str> = k.set.split('&').filter(|p| !p.split('=').next().is_some_and(|key| touched.contains(&key))).collect();
            let instead = y.set.iter().map(|(k, v)| format!("{k}={v}"));
            k.set = kept.iter().map(|p| p.to_string()).chain(instead).filter(|p| !p.is_empty()).collect::<Vec<_>>().join("&");
            k.status = Status::Unmodelled;
            k.note = format!("{reason}: {}", y.then);
        }
        *last = candidate;
        now = after;
    }
    now
}

/// A configuration with an import applied on top (the page's "import into what I have").
pub fn apply(cfg: &Config, imported: &Imported) -> Config {
    let mut out = cfg.clone();
    let _ = config::apply_pairs(&mut out, imported.pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect());
    out
}

fn syntax(file: &str, text: &str, mut e: SyntaxError) -> ImportError {
    if e.line.is_none() {
        e.line = unplaced_line(text, &e.reason);
    }
    let near = e.line.and_then(|l| text.lines().nth(l.saturating_sub(1))).and_then(key_on_line);
    ImportError::Syntax { file: file.to_string(), line: e.line, near, reason: e.reason }
}

/// Where an error the parser could not place is (yaml_serde gives no location for "more than
/// one document" and some others): the first line whose prefix of the file already fails so.
fn unplaced_line(text: &str, reason: &str) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    (1..=lines.len().min(5000)).find(|&k| tree::parse_yaml(&lines[..k].join("\n")).err().is_some_and(|e| e.reason == reason))
}

/// The key a line writes (`key:`, `key =`, `"key":`, `--flag`), for syntax errors.
fn key_on_line(line: &str) -> Option<String> {
    let t = line.trim().trim_start_matches("- ");
    if let Some(flag) = t.split_whitespace().find(|w| w.starts_with("--")) {
        return Some(flag.to_string());
    }
    let end = t.find([':', '='])?;
    let k = t[..end].trim().trim_matches(['"', '\'', '[', ']']).trim();
    (!k.is_empty() && k.len() <= 80 && !k.contains(' ')).then(|| k.to_string())
}

/// Keys that say which framework wrote a file, looked for in this order.
const MARKERS: &[(Format, &[&str])] = &[
    (Format::Peft, &["peft_type"]),
    (Format::Axolotl, &["base_model", "micro_batch_size", "sequence_len"]),
    (Format::Trainer, &["per_device_train_batch_size", "optim", "logging_strategy"]),
    (Format::Deepspeed, &["zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size", "zero_allow_untested_optimizer"]),
    (Format::Accelerate, &["distributed_type", "compute_environment", "num_processes"]),
    (Format::Litgpt, &["checkpoint_dir", "lora_r", "devices"]),
    (Format::MegatronBridge, &["ddp", "mixed_precision", "trainer"]),
    (Format::Torchtune, &["batch_size", "enable_activation_checkpointing", "dtype", "tokenizer", "checkpointer"]),
    (Format::Torchtitan, &["parallelism", "activation_checkpoint", "job"]),
];

fn recognise(name: &str, text: &str, given: Option<Format>) -> Result<(Format, Value), ImportError> {
    let lower = name.to_ascii_lowercase();
    let trimmed = text.trim_start_matches('\u{feff}').trim_start();
    if trimmed.is_empty() {
        return Err(ImportError::Format { file: name.into(), reason: "the file is empty".into() });
    }
    let looks_args = given == Some(Format::MegatronLm)
        || (given.is_none()
            && (lower.ends_with(".sh")
                || lower.ends_with(".args")
                || lower.ends_with(".txt")
                || trimmed.starts_with("--")
                || trimmed.starts_with("torchrun")
                || trimmed.starts_with("python"))
            && text.contains("--"));
    if looks_args {
        return Ok((Format::MegatronLm, Value::Null));
    }
    let root = if trimmed.starts_with('{') || lower.ends_with(".json") {
        tree::parse_json(text)
    } else if lower.ends_with(".toml") || given == Some(Format::Torchtitan) {
        tree::parse_toml(text)
    } else {
        tree::parse_yaml(text)
    }
    .map_err(|e| syntax(name, text, e))?;
    if !root.is_object() {
        let Some(first) = text.lines().position(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#')).map(|i| i + 1) else {
            return Err(ImportError::Format { file: name.into(), reason: "the file is empty (only comments)".into() });
        };
        let first = Some(first);
        let reason = "expected a table of keys at the top (a YAML/TOML mapping or a JSON object)".to_string();
        return Err(syntax(name, text, SyntaxError { line: first, reason }));
    }
    if let Some(f) = given {
        return Ok((f, root));
    }
    if lower.ends_with(".toml") {
        return Ok((Format::Torchtitan, root));
    }
    if root.get("model").and_then(|m| m.get("_component_")).is_some() {
        return Ok((Format::Torchtune, root));
    }
    if root.get("model").and_then(|m| m.get("tensor_model_parallel_size")).is_some() {
        return Ok((Format::MegatronBridge, root));
    }
    for (format, keys) in MARKERS {
        if keys.iter().any(|k| root.get(k).is_some()) {
            return Ok((*format, root));
        }
    }
    let all: Vec<String> = MARKERS.iter().flat_map(|(_, ks)| ks.iter().map(|k| format!("`{k}`"))).collect();
    Err(ImportError::Format { file: name.into(), reason: format!("no key says which framework wrote it (looked for {})", all.join(", ")) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_that_gives_way_drops_and_sets_keys_and_one_that_changes_nothing_is_not_tried() {
        let pairs = |p: &[(&str, &str)]| p.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>();
        let job = pairs(&[("compile", "true"), ("compile_regions", "block"), ("framework", "torchtitan"), ("fp8", "torchao-rowwise")]);
        assert_eq!(Yield::eager().apply(&job), Some(pairs(&[("framework", "torchtitan"), ("fp8", "torchao-rowwise")])));
        let hf = Yield { drop: Vec::new(), set: vec![("framework", "hf".into())], then: String::new() };
        assert_eq!(
            hf.apply(&job),
            Some(pairs(&[("compile", "true"), ("compile_regions", "block"), ("fp8", "torchao-rowwise"), ("framework", "hf")]))
        );
        assert_eq!(Yield::eager().apply(&pairs(&[("fp8", "torchao-rowwise")])), None, "nothing to drop");
        assert_eq!(hf.apply(&pairs(&[("framework", "hf")])), None, "already so");
    }

    #[test]
    fn a_bad_value_is_reported_with_its_line_and_the_rest_is_kept() {
        let yaml = "model:\n  _component_: torchtune.models.llama3_1.llama3_1_8b\nbatch_size: lots\ngradient_accumulation_steps: 4\n";
        let imp = import(&[("a.yaml", yaml)]).expect("imports");
        assert_eq!(imp.errors.len(), 1);
        let msg = imp.errors[0].to_string();
        assert!(msg.contains("line 3") && msg.contains("`batch_size`"), "{msg}");
        assert_eq!(imp.config.accum, 4);
        assert_eq!(imp.config.batch, 1);
    }

    #[test]
    fn a_syntax_error_names_the_line_and_the_key_on_it() {
        let err = import(&[("t.toml", "[training]\nseq_len = \n")]).expect_err("bad toml");
        assert!(err.to_string().contains("line 2") && err.to_string().contains("seq_len"), "{err}");
    }

    #[test]
    fn a_file_no_framework_wrote_says_which_keys_were_looked_for() {
        let err = import(&[("x.yaml", "colour: blue\n")]).expect_err("not a config");
        assert!(err.to_string().contains("`zero_optimization`"), "{err}");
    }

    #[test]
    fn model_parallel_sizes_bring_enough_gpus() {
        let imp = import(&[("a.args", "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --bf16")]).expect("imports");
        assert_eq!((imp.config.tp, imp.config.pp, imp.config.gpus), (2, 2, 4));
    }
}
