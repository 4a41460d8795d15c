//! Exit codes (DESIGN.md §5) and the classification of errors into them.

/// The process exit codes that other tools rely on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Success = 0,
    Error = 1,
    Usage = 2,
    NotFound = 3,
    Conflict = 4,
    EvidenceIncomplete = 5,
}

impl Exit {
    pub fn code(self) -> u8 {
        self as u8
    }
}

/// Implemented by every typed error of the library so the top level can pick the exit code
/// without string matching.
pub trait HasExit {
    fn exit(&self) -> Exit;
}

/// An error that ends the process with a specific exit code and a message written for the operator.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Coded {
    pub exit: Exit,
    pub message: String,
}

impl Coded {
    pub fn new(exit: Exit, message: impl Into<String>) -> Self {
        Self {
            exit,
            message: message.into(),
        }
    }
}

impl HasExit for Coded {
    fn exit(&self) -> Exit {
        self.exit
    }
}

/// An error and its causes on one line (`a: b: c`), a cause left out when the text before
/// already says it (many errors repeat their source's message).
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut msg = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !msg.contains(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
        source = s.source();
    }
    msg
}
