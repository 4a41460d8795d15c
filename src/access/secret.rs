//! A string that must never be printed: client secrets, federated tokens.

use std::fmt;

/// A secret value. `Debug` and `Display` print `***`, it does not implement `Serialize`, and the
/// only way to read it is [`SecretString::expose`], so it cannot reach a log line, an error
/// message or a JSON document by accident.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretString(String);

impl SecretString {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself, for the one place that sends it (the token request).
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for SecretString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for SecretString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_never_prints() {
        let s = SecretString::new("hunter2-very-secret");
        assert_eq!(format!("{s}"), "***");
        assert_eq!(format!("{s:?}"), "***");
        assert_eq!(format!("{:?}", Some(s.clone())), "Some(***)");
        assert_eq!(s.expose(), "hunter2-very-secret");
    }
}
