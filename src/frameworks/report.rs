//! What an import returns: the configuration, one report line per key of every file, and the
//! errors (each naming its file, line and key).

use super::tree::{self, boolean, count};
use crate::config::Config;
use serde::Serialize;
use serde_json::Value;

/// The config formats `import` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// A torchtune recipe config (YAML, `_component_` builders).
    Torchtune,
    /// A torchtitan job config (TOML, v0.1–0.2 layout).
    Torchtitan,
    /// A DeepSpeed config (JSON).
    Deepspeed,
    /// An accelerate config (YAML: `accelerate config`'s file).
    Accelerate,
    /// The Trainer's `TrainingArguments` as JSON (`to_json_string()`, or `training_args.bin`'s dict).
    Trainer,
    /// PEFT's `adapter_config.json` (a `LoraConfig`).
    Peft,
    /// An axolotl config (YAML).
    Axolotl,
    /// A litgpt `config_hub` finetune config (YAML).
    Litgpt,
    /// A Megatron-Bridge `ConfigContainer` (YAML) or a NeMo 1.x Megatron GPT config.
    MegatronBridge,
    /// Megatron-LM's command-line arguments (`pretrain_gpt.py --tensor-model-parallel-size …`).
    MegatronLm,
}

impl Format {
    pub const ALL: [Format; 10] = [
        Format::Torchtune,
        Format::Torchtitan,
        Format::Deepspeed,
        Format::Accelerate,
        Format::Trainer,
        Format::Peft,
        Format::Axolotl,
        Format::Litgpt,
        Format::MegatronBridge,
        Format::MegatronLm,
    ];

    /// The format's name, as `--as` and the report spell it.
    pub fn name(self) -> &'static str {
        match self {
            Format::Torchtune => "torchtune",
            Format::Torchtitan => "torchtitan",
            Format::Deepspeed => "deepspeed",
            Format::Accelerate => "accelerate",
            Format::Trainer => "trainer",
            Format::Peft => "peft",
            Format::Axolotl => "axolotl",
            Format::Litgpt => "litgpt",
            Format::MegatronBridge => "megatron-bridge",
            Format::MegatronLm => "megatron-lm",
        }
    }

    /// The format named `name`.
    pub fn parse(name: &str) -> Option<Format> {
        Format::ALL.into_iter().find(|f| f.name() == name.trim().to_ascii_lowercase())
    }

    /// The order files combine in: the training script's own arguments first, then the
    /// launcher's (accelerate), then DeepSpeed's (which the Trainer defers to under DeepSpeed).
    pub(crate) fn rank(self) -> u8 {
        match self {
            Format::Accelerate => 1,
            Format::Deepspeed => 2,
            _ => 0,
        }
    }
}

/// What the import made of one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Mapped onto configuration keys (`set` says which).
    Understood,
    /// Does not change memory (the note says why).
    Ignored,
    /// Changes memory in a way trainmem does not model yet; the note says what the estimate
    /// assumes instead (`set`, when anything was set, is the nearest modelled setting).
    Unmodelled,
    /// Not a key this import knows for the format.
    Unknown,
    /// Not in the file: the framework's default for it, which the run gets (`set`).
    Default,
    /// Known, but its value cannot be used (the note says why); the rest of the file still is.
    Invalid,
}

/// One key of one file.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KeyReport {
    pub file: String,
    /// The key as the file writes it: dotted for nested tables, `--flag` for command lines.
    pub key: String,
    /// The 1-based line it is on, when found.
    pub line: Option<usize>,
    pub status: Status,
    /// The configuration keys it set, as `key=value` joined by `&` (empty: none).
    pub set: String,
    /// Why it is ignored or unmodelled, or what was assumed.
    pub note: String,
}

/// The result of an import.
#[derive(Clone, Debug, PartialEq)]
pub struct Imported {
    /// The configuration: trainmem's defaults, then each file's keys (see [`Format::rank`]).
    pub config: Config,
    /// The share-URL query of `config` (without `?`).
    pub query: String,
    /// Every key of every file, in file order.
    pub keys: Vec<KeyReport>,
    /// The configuration keys the files set, in the order they were applied (last wins).
    pub pairs: Vec<(String, String)>,
    /// Each file's name and the format it was read as.
    pub formats: Vec<(String, Format)>,
    /// The keys whose values could not be used (also reported `invalid`).
    pub errors: Vec<ImportError>,
}

impl Imported {
    /// `{"query": …, "keys": [{"file", "key", "line", "status", "set", "note"}]}`.
    pub fn to_json(&self) -> String {
        #[derive(Serialize)]
        struct Doc<'a> {
            query: &'a str,
            formats: Vec<FormatJson<'a>>,
            keys: &'a [KeyReport],
            errors: Vec<String>,
        }
        #[derive(Serialize)]
        struct FormatJson<'a> {
            file: &'a str,
            format: &'static str,
        }
        let doc = Doc {
            query: &self.query,
            formats: self.formats.iter().map(|(file, f)| FormatJson { file, format: f.name() }).collect(),
            keys: &self.keys,
            errors: self.errors.iter().map(|e| e.to_string()).collect(),
        };
        serde_json::to_string_pretty(&doc).unwrap_or_default()
    }

    /// The query on the first line, then one line per key.
    pub fn to_text(&self) -> String {
        let mut s = format!("{}\n", self.query);
        for k in &self.keys {
            let line = k.line.map_or(String::new(), |l| format!(":{l}"));
            let set = if k.set.is_empty() { String::new() } else { format!(" -> {}", k.set) };
            let note = if k.note.is_empty() { String::new() } else { format!(" ({})", k.note) };
            let status = serde_json::to_value(k.status).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
            s.push_str(&format!("{status:<10} {}{line} {}{set}{note}\n", k.file, k.key));
        }
        s
    }
}

/// Why a file, or one of its keys, could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ImportError {
    #[error("no file given")]
    NoFiles,
    #[error("{}", where_(file, *line, near.as_deref(), reason))]
    Syntax { file: String, line: Option<usize>, near: Option<String>, reason: String },
    #[error("{file}: {reason}")]
    Format { file: String, reason: String },
    #[error("{file}{}: `{key}` = {value}: {reason}", line.map_or(String::new(), |l| format!(", line {l}")))]
    Value { file: String, line: Option<usize>, key: String, value: String, reason: String },
}

fn where_(file: &str, line: Option<usize>, near: Option<&str>, reason: &str) -> String {
    let mut s = file.to_string();
    if let Some(l) = line {
        s += &format!(", line {l}");
    }
    if let Some(k) = near {
        s += &format!(", near `{k}`");
    }
    format!("{s}: {reason}")
}

/// What a format's reader makes of one key.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Out {
    pub status: Status,
    pub set: Vec<(&'static str, String)>,
    pub note: String,
}

impl Out {
    pub fn set(pairs: Vec<(&'static str, String)>) -> Out {
        Out { status: Status::Understood, set: pairs, note: String::new() }
    }
    pub fn one(key: &'static str, value: impl ToString) -> Out {
        Out::set(vec![(key, value.to_string())])
    }
    pub fn ignored(why: impl Into<String>) -> Out {
        Out { status: Status::Ignored, set: Vec::new(), note: why.into() }
    }
    pub fn unmodelled(why: impl Into<String>) -> Out {
        Out { status: Status::Unmodelled, set: Vec::new(), note: why.into() }
    }
    pub fn unknown() -> Out {
        Out { status: Status::Unknown, set: Vec::new(), note: String::new() }
    }
    pub fn invalid(why: impl Into<String>) -> Out {
        Out { status: Status::Invalid, set: Vec::new(), note: why.into() }
    }
    /// The same outcome with a note.
    pub fn note(mut self, note: impl Into<String>) -> Out {
        self.note = note.into();
        self
    }
    /// Understood, with what it does in a note (its configuration keys are set later, from
    /// several keys together).
    pub fn status_understood(mut self) -> Out {
        self.status = Status::Understood;
        self
    }
    /// Unmodelled, but the nearest modelled setting is applied.
    pub fn approx(mut self, why: impl Into<String>) -> Out {
        self.status = Status::Unmodelled;
        self.note = why.into();
        self
    }
}

/// The reader's state for one file: its reports and the configuration keys it sets.
pub(crate) struct FileState<'a> {
    pub file: String,
    pub text: &'a str,
    pub reports: Vec<KeyReport>,
    pub pairs: Vec<(&'static str, String)>,
    pub errors: Vec<ImportError>,
    /// What this file's settings may give way to when the estimator refuses the configuration,
    /// in the order to try ([`FileState::give_way`]).
    pub yields: Vec<Yield>,
}

/// A change the import makes when the estimator refuses the configuration the files ask for: the
/// estimator alone judges what it models (`estimator::validate_consistency`); which setting gives
/// way is the importer's preference (torch.compile before the recomputation or float8 the file
/// also asks for; a framework's own code before compile, where its code is what was refused).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Yield {
    /// Keys put back to their defaults.
    pub drop: Vec<&'static str>,
    /// Pairs set instead.
    pub set: Vec<(&'static str, String)>,
    /// What the estimate then follows, after the estimator's reason in the key's report.
    pub then: String,
}

impl Yield {
    /// torch.compile gives way first, whoever set it: the step is estimated eager and the
    /// recomputation, float8 or framework the files ask for are kept.
    pub fn eager() -> Yield {
        Yield { drop: vec!["compile", "compile_regions"], set: Vec::new(), then: "estimated eager (trainmem keeps compile=false)".into() }
    }

    /// The keys this change touches.
    pub fn keys(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.drop.iter().copied().chain(self.set.iter().map(|(k, _)| *k))
    }

    /// `pairs` with this change made; `None` where it changes nothing.
    pub fn apply(&self, pairs: &[(String, String)]) -> Option<Vec<(String, String)>> {
        let mut out: Vec<(String, String)> = pairs.iter().filter(|(k, _)| !self.drop.contains(&k.as_str())).cloned().collect();
        for (k, v) in &self.set {
            out.retain(|(o, _)| o != k);
            out.push((k.to_string(), v.clone()));
        }
        let same = out.len() == pairs.len() && out.iter().all(|p| pairs.contains(p));
        (!same).then_some(out)
    }
}

impl<'a> FileState<'a> {
    pub fn new(file: &str, text: &'a str) -> FileState<'a> {
        FileState { file: file.to_string(), text, reports: Vec::new(), pairs: Vec::new(), errors: Vec::new(), yields: Vec::new() }
    }

    /// Records the outcome of `key` (whose value is `value`), at the line where the text writes it.
    pub fn record(&mut self, key: &str, value: &Value, out: Out) {
        let line = tree::line_of(self.text, key);
        self.record_at(key, line, &tree::show(value), out);
    }

    /// Records an outcome at a known line.
    pub fn record_at(&mut self, key: &str, line: Option<usize>, value: &str, out: Out) {
        if out.status == Status::Invalid {
            self.errors.push(ImportError::Value {
                file: self.file.clone(),
                line,
                key: key.to_string(),
                value: value.chars().take(60).collect(),
                reason: out.note.clone(),
            });
        }
        let set = join(&out.set);
        self.pairs.extend(out.set);
        self.reports.push(KeyReport { file: self.file.clone(), key: key.to_string(), line, status: out.status, set, note: out.note });
    }

    /// A key the file leaves out, whose framework default the run gets.
    pub fn default(&mut self, key: &str, pairs: Vec<(&'static str, String)>, note: &str) {
        let set = join(&pairs);
        self.pairs.extend(pairs);
        self.reports.push(KeyReport {
            file: self.file.clone(),
            key: key.to_string(),
            line: None,
            status: Status::Default,
            set,
            note: note.to_string(),
        });
    }

    /// Whether a configuration key has been set by this file so far.
    /// Where the estimator refuses the configuration, try `set` instead of what this file set for
    /// those keys before anything else gives way (`then`: what the estimate follows then).
    pub fn give_way(&mut self, set: Vec<(&'static str, String)>, then: &str) {
        self.yields.push(Yield { drop: Vec::new(), set, then: then.to_string() });
    }

    pub fn has(&self, key: &str) -> bool {
        self.pairs.iter().any(|(k, _)| *k == key)
    }
}

fn join(pairs: &[(&'static str, String)]) -> String {
    pairs.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("&")
}

pub(crate) fn positive(v: &Value, key: &'static str) -> Out {
    count(v).filter(|n| *n > 0).map_or_else(|| Out::invalid("expected a positive whole number"), |n| Out::one(key, n))
}

pub(crate) fn on_off(v: &Value, when_on: &str, when_off: &str) -> Out {
    match boolean(v) {
        Some(true) => Out::unmodelled(when_on),
        Some(false) => Out::ignored(when_off),
        None if v.is_null() => Out::ignored(when_off),
        None => Out::invalid("expected true or false"),
    }
}

/// An adapter dropout probability (peft / axolotl / litgpt `lora_dropout`, torchtune
/// `model.lora_dropout`): `lora_dropout`, which gives every adapter its own dropped copy of its
/// input and a mask (`Builder::lora_dropout`); 0 or null is no dropout (the default: not set).
pub(crate) fn dropout(v: &Value) -> Out {
    match tree::float(v) {
        Some(0.0) => Out::ignored("no adapter dropout (lora_dropout = 0, the default)"),
        Some(p) if (0.0..1.0).contains(&p) => {
            Out::one("lora_dropout", p).note("each adapter keeps its dropped input and the dropout's mask")
        }
        None if v.is_null() => Out::ignored("no adapter dropout"),
        _ => Out::invalid("expected a probability in [0, 1)"),
    }
}
