//! What a command hands back to be printed: a human rendering and a JSON document.

use std::io::Write;

use crate::cli::OutputFormat;
use crate::error::Exit;

/// The outcome of a command: its JSON document, its human text, and its exit code.
#[derive(Debug)]
pub struct Report {
    pub json: serde_json::Value,
    pub human: String,
    pub exit: Exit,
}

impl Report {
    pub fn new(json: serde_json::Value, human: impl Into<String>) -> Self {
        Self {
            json,
            human: human.into(),
            exit: Exit::Success,
        }
    }

    pub fn with_exit(mut self, exit: Exit) -> Self {
        self.exit = exit;
        self
    }

    /// Raw text output (completions, man page): printed as-is whatever the format.
    pub fn raw(text: impl Into<String>) -> Self {
        let text = text.into();
        Self {
            json: serde_json::Value::String(text.clone()),
            human: text,
            exit: Exit::Success,
        }
    }

    pub fn print(&self, format: OutputFormat) -> std::io::Result<()> {
        let mut out = std::io::stdout().lock();
        match format {
            OutputFormat::Json => writeln!(out, "{}", serde_json::to_string(&self.json)?),
            OutputFormat::Human => {
                if self.human.is_empty() {
                    Ok(())
                } else if self.human.ends_with('\n') {
                    write!(out, "{}", self.human)
                } else {
                    writeln!(out, "{}", self.human)
                }
            }
        }
    }
}
