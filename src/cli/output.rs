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

/// "1 version", "0 versions", "2 versions": a count and its noun, in the number it needs.
pub fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// An ARM resource id as human output shows it: a gallery resource as `gallery/definition/version`
/// (or `gallery/definition`), anything else as `resource-group/type/name[/type/name...]`; what is
/// not an ARM id is returned as it is. JSON output keeps full ids.
pub fn short_id(id: &str) -> String {
    let parts: Vec<&str> = id.trim_matches('/').split('/').collect();
    let find = |key: &str| {
        parts
            .iter()
            .position(|p| p.eq_ignore_ascii_case(key))
            .filter(|i| i + 1 < parts.len())
    };
    if !parts
        .first()
        .is_some_and(|p| p.eq_ignore_ascii_case("subscriptions"))
    {
        return id.to_string();
    }
    if let Some(g) = find("galleries") {
        let mut out = vec![parts[g + 1]];
        if let Some(i) = find("images") {
            out.push(parts[i + 1]);
        }
        if let Some(v) = find("versions") {
            out.push(parts[v + 1]);
        }
        return out.join("/");
    }
    match (find("resourceGroups"), find("providers")) {
        // providers/Namespace/type/name...: drop the subscription and the namespace.
        (Some(rg), Some(p)) if p + 2 < parts.len() => {
            let mut out = vec![parts[rg + 1]];
            out.extend_from_slice(&parts[p + 2..]);
            out.join("/")
        }
        _ => id.to_string(),
    }
}

/// Every ARM id (`/subscriptions/...` up to a space, comma, semicolon or parenthesis) in `text`
/// shortened with [`short_id`].
pub fn shorten_ids(text: &str) -> String {
    const START: &str = "/subscriptions/";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = find_ci(rest, START) {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| c.is_whitespace() || matches!(c, ',' | ';' | '(' | ')' | '"' | '\''))
            .unwrap_or(tail.len());
        // A trailing full stop or colon ends the sentence, not the id.
        let id = tail[..end].trim_end_matches(['.', ':']);
        out.push_str(&short_id(id));
        rest = &tail[id.len()..];
    }
    out.push_str(rest);
    out
}

fn find_ci(haystack: &str, needle: &str) -> Option<usize> {
    haystack
        .as_bytes()
        .windows(needle.len())
        .position(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
}

#[cfg(test)]
mod tests {

    /// Issue 48 item 5: "1 versions" and "the 0 versions marked delete" were printed.
    #[test]
    fn a_count_takes_the_number_its_noun_needs() {
        assert_eq!(count(0, "version"), "0 versions");
        assert_eq!(count(1, "version"), "1 version");
        assert_eq!(count(2, "CID"), "2 CIDs");
    }
    use super::*;

    const VERSION: &str = "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/rg/providers/Microsoft.Compute/galleries/g/images/bosh-x/versions/1.506.0";
    const VM: &str = "/subscriptions/11111111-1111-1111-1111-111111111111/resourceGroups/bosh-rg/providers/Microsoft.Compute/virtualMachines/vm-1";

    #[test]
    fn arm_ids_are_shortened_for_people() {
        assert_eq!(short_id(VERSION), "g/bosh-x/1.506.0");
        assert_eq!(short_id(VM), "bosh-rg/virtualMachines/vm-1");
        assert_eq!(
            short_id(&format!("{VM}/extensions/e")),
            "bosh-rg/virtualMachines/vm-1/extensions/e"
        );
        assert_eq!(short_id("bosh-stemcell-x"), "bosh-stemcell-x");
        assert_eq!(
            shorten_ids(&format!("deleted {VERSION}: in use by VirtualMachine {VM}, and {VM}.")),
            "deleted g/bosh-x/1.506.0: in use by VirtualMachine bosh-rg/virtualMachines/vm-1, and bosh-rg/virtualMachines/vm-1."
        );
        assert_eq!(shorten_ids("no ids here"), "no ids here");
    }
}
