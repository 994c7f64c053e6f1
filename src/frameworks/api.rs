//! The frameworks as the page reaches them: JSON in, JSON out, through the lazily loaded
//! frameworks module (`src/bin/trainmem-frameworks.rs`). The page's first screen links none of
//! the parsers (`yaml_serde`, `toml`, `shlex`); it names only this file's plain data (the reply
//! types and the format lists) and loads the module the first time a file is imported or
//! exported.
//!
//! - [`import_json`]: files (`[{"name", "text", "format"?}]`) → an [`ImportReply`]: the
//!   configuration's share-URL query (the same as `trainmem import` prints for the same files)
//!   and every key of every file. A file that cannot be read at all (a syntax error) is named
//!   with its line and key in `errors` and left out; the other files are still read.
//! - [`export_json`]: a configuration's query and a format → the files to run
//!   ([`ExportReply`]).

use super::{export_files, import_with, ExportFormat, Format, ImportError};
use crate::config::decode_query;
use serde::{Deserialize, Serialize};

/// One file handed to the import.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FileIn {
    /// Its name (the extension helps recognise the format); empty: named `pasted-N.ext` from
    /// its contents.
    #[serde(default)]
    pub name: String,
    pub text: String,
    /// The format to read it as (a [`Format`] name); absent or empty: recognised.
    #[serde(default)]
    pub format: Option<String>,
}

/// One key of one file, as the report shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeyRow {
    pub file: String,
    pub key: String,
    pub line: Option<usize>,
    /// understood, ignored, unmodelled, unknown, default or invalid.
    pub status: String,
    /// The configuration keys it set (`key=value&…`).
    pub set: String,
    pub note: String,
}

/// What an import made of the files.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ImportReply {
    /// Whether any file was read: then `query` is the configuration to apply.
    pub read: bool,
    /// The configuration's share-URL query (without `?`; empty for the default configuration).
    pub query: String,
    /// Each file read and the format it was read as.
    pub formats: Vec<(String, String)>,
    pub keys: Vec<KeyRow>,
    /// Every problem, each naming its file (and line and key where it has them).
    pub errors: Vec<String>,
    /// The files left out because they could not be read at all.
    pub skipped: Vec<String>,
}

/// One written file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FileOut {
    pub name: String,
    pub text: String,
}

/// What an export wrote.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExportReply {
    pub files: Vec<FileOut>,
    pub error: Option<String>,
}

/// The formats `export` writes: name and words.
pub fn export_formats() -> Vec<(&'static str, &'static str)> {
    ExportFormat::ALL
        .into_iter()
        .map(|f| {
            let words = match f {
                ExportFormat::Torchtune => "torchtune YAML",
                ExportFormat::Torchtitan => "torchtitan TOML",
                ExportFormat::AccelerateDeepspeed => "accelerate + DeepSpeed",
                ExportFormat::Megatron => "Megatron-LM arguments",
            };
            (f.name(), words)
        })
        .collect()
}

/// The formats `import` reads, by name.
pub fn import_formats() -> Vec<&'static str> {
    Format::ALL.into_iter().map(Format::name).collect()
}

/// A name for a pasted file without one, from what it looks like: `pasted-2.json`.
pub fn pasted_name(text: &str, n: usize) -> String {
    let t = text.trim_start_matches('\u{feff}').trim_start();
    let toml_header = t.lines().any(|l| {
        let l = l.trim();
        l.starts_with('[')
            && l.ends_with(']')
            && l.len() > 2
            && l[1..l.len() - 1].chars().all(|c| c.is_alphanumeric() || "._-[]".contains(c))
    });
    let ext = if t.starts_with('{') {
        "json"
    } else if t.starts_with("--") || t.starts_with("torchrun") || t.starts_with("python") {
        "sh"
    } else if toml_header && !t.lines().any(|l| l.trim_end().ends_with(':')) {
        "toml"
    } else {
        "yaml"
    };
    format!("pasted-{n}.{ext}")
}

/// The file an error names, when it names one.
fn file_of(e: &ImportError) -> Option<&str> {
    match e {
        ImportError::Syntax { file, .. } | ImportError::Format { file, .. } | ImportError::Value { file, .. } => Some(file),
        ImportError::NoFiles => None,
    }
}

/// Reads the files: every file that can be read is (a file that cannot is named in `errors`
/// and `skipped`, and the rest keep their keys).
pub fn import_files(files: &[FileIn]) -> ImportReply {
    let mut reply = ImportReply::default();
    let mut named: Vec<(String, &str, Option<Format>)> = Vec::new();
    for (i, f) in files.iter().enumerate() {
        if f.text.trim().is_empty() {
            continue;
        }
        let name = if f.name.trim().is_empty() { pasted_name(&f.text, i + 1) } else { f.name.trim().to_string() };
        let format = match f.format.as_deref().map(str::trim).filter(|s| !s.is_empty() && *s != "auto") {
            None => None,
            Some(s) => match Format::parse(s) {
                Some(f) => Some(f),
                None => {
                    reply.errors.push(format!("{name}: unknown format {s} (one of {})", import_formats().join(", ")));
                    reply.skipped.push(name);
                    continue;
                }
            },
        };
        named.push((name, f.text.as_str(), format));
    }
    loop {
        if named.is_empty() {
            if reply.errors.is_empty() {
                reply.errors.push(ImportError::NoFiles.to_string());
            }
            return reply;
        }
        let args: Vec<(&str, &str, Option<Format>)> = named.iter().map(|(n, t, f)| (n.as_str(), *t, *f)).collect();
        match import_with(&args) {
            Ok(imported) => {
                reply.read = true;
                reply.query = imported.query;
                reply.formats = imported.formats.into_iter().map(|(f, fmt)| (f, fmt.name().to_string())).collect();
                reply.keys = imported
                    .keys
                    .into_iter()
                    .map(|k| KeyRow {
                        file: k.file,
                        key: k.key,
                        line: k.line,
                        status: serde_json::to_value(k.status).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default(),
                        set: k.set,
                        note: k.note,
                    })
                    .collect();
                reply.errors.extend(imported.errors.iter().map(ToString::to_string));
                return reply;
            }
            Err(e) => {
                reply.errors.push(e.to_string());
                // Leave the file out and read the others; an error that names no file ends it.
                let Some(bad) = file_of(&e).map(str::to_string) else { return reply };
                let before = named.len();
                named.retain(|(n, _, _)| *n != bad);
                if named.len() == before {
                    return reply;
                }
                reply.skipped.push(bad);
            }
        }
    }
}

/// [`import_files`] as JSON: `[{"name", "text", "format"?}]` in, an [`ImportReply`] out.
pub fn import_json(request: &str) -> String {
    let reply = match serde_json::from_str::<Vec<FileIn>>(request) {
        Ok(files) => import_files(&files),
        Err(e) => ImportReply { errors: vec![format!("the page sent no file list: {e}")], ..ImportReply::default() },
    };
    serde_json::to_string(&reply).unwrap_or_default()
}

/// The files of `format` for the configuration of `query`.
pub fn export_query(query: &str, format: &str) -> ExportReply {
    let Some(f) = ExportFormat::parse(format) else {
        let names: Vec<&str> = ExportFormat::ALL.into_iter().map(ExportFormat::name).collect();
        return ExportReply { files: Vec::new(), error: Some(format!("unknown export format {format} (one of {})", names.join(", "))) };
    };
    let decoded = decode_query(query);
    if let Some(e) = decoded.errors.first() {
        return ExportReply { files: Vec::new(), error: Some(format!("{}: {}", e.key, e.reason)) };
    }
    let files = export_files(&decoded.config, f).into_iter().map(|f| FileOut { name: f.name, text: f.text }).collect();
    ExportReply { files, error: None }
}

/// [`export_query`] as JSON.
pub fn export_json(query: &str, format: &str) -> String {
    serde_json::to_string(&export_query(query, format)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TUNE: &str =
        "model:\n  _component_: torchtune.models.llama3_1.llama3_1_8b\nbatch_size: 2\ndtype: bf16\nenable_activation_checkpointing: True\n";
    const DS: &str = "{\"zero_optimization\": {\"stage\": 3}, \"bf16\": {\"enabled\": true}, \"train_micro_batch_size_per_gpu\": 2}";

    fn file(name: &str, text: &str) -> FileIn {
        FileIn { name: name.into(), text: text.into(), format: None }
    }

    #[test]
    fn the_reply_has_the_clis_query_and_every_key() {
        let reply = import_files(&[file("tune.yaml", TUNE), file("ds.json", DS)]);
        let cli = crate::frameworks::import(&[("tune.yaml", TUNE), ("ds.json", DS)]).map(|i| i.query).unwrap_or_default();
        assert!(reply.read, "{:?}", reply.errors);
        assert_eq!(reply.query, cli);
        assert!(reply.query.contains("zero=3"), "{}", reply.query);
        assert_eq!(reply.formats, [("tune.yaml".to_string(), "torchtune".to_string()), ("ds.json".to_string(), "deepspeed".to_string())]);
        assert!(reply.keys.iter().any(|k| k.file == "tune.yaml" && k.key == "batch_size" && k.status == "understood" && k.line == Some(3)));
        // Through JSON, as the page calls it.
        let json = import_json(&serde_json::to_string(&[file("tune.yaml", TUNE), file("ds.json", DS)]).unwrap_or_default());
        assert_eq!(serde_json::from_str::<ImportReply>(&json).ok(), Some(reply));
    }

    #[test]
    fn a_file_that_cannot_be_read_is_named_and_the_others_are_kept() {
        let broken = "model:\n  _component_: x\nbatch_size: [1,\n";
        let reply = import_files(&[file("bad.yaml", broken), file("ds.json", DS)]);
        assert!(reply.read);
        assert_eq!(reply.skipped, ["bad.yaml"]);
        assert!(reply.errors[0].starts_with("bad.yaml, line"), "{:?}", reply.errors);
        assert_eq!(reply.query, crate::frameworks::import(&[("ds.json", DS)]).map(|i| i.query).unwrap_or_default());
        // Nothing readable: nothing applies.
        let none = import_files(&[file("bad.yaml", broken)]);
        assert!(!none.read && none.errors.len() == 1);
        assert!(!import_files(&[]).read);
    }

    #[test]
    fn pasted_text_is_named_by_its_look() {
        assert_eq!(pasted_name(DS, 2), "pasted-2.json");
        assert_eq!(pasted_name(TUNE, 1), "pasted-1.yaml");
        assert_eq!(pasted_name("[model]\nname = \"llama3\"\n", 1), "pasted-1.toml");
        assert_eq!(pasted_name("--tensor-model-parallel-size 2", 3), "pasted-3.sh");
        let reply = import_files(&[file("", DS)]);
        assert_eq!(reply.formats, [("pasted-1.json".to_string(), "deepspeed".to_string())]);
    }

    #[test]
    fn every_format_exports_and_reads_back() {
        for (name, _) in export_formats() {
            let reply = export_query("model=llama-3.1-8b&zero=3&gpus=8", name);
            assert_eq!(reply.error, None, "{name}");
            assert!(!reply.files.is_empty() && reply.files.iter().all(|f| !f.text.is_empty()), "{name}");
        }
        assert!(export_query("", "nonsense").error.is_some());
        assert!(export_json("zero=banana", "torchtune").contains("zero"));
        assert_eq!(import_formats().len(), Format::ALL.len());
    }
}
