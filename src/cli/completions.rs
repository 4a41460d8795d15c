//! `completions SHELL`: shell completions, or `man` for roff man pages (`--dir DIR` writes the
//! top-level page and one page per command at every level, each one the page above refers to).

use std::path::PathBuf;

use clap::{Args, CommandFactory, ValueEnum};
use serde_json::json;

use super::{Cli, GlobalArgs, Report};
use crate::error::{Coded, Exit};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Target {
    Bash,
    Zsh,
    Fish,
    Elvish,
    Powershell,
    /// A man page in roff.
    Man,
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// Shell to generate completions for, or `man` for the man page.
    #[arg(value_enum)]
    pub shell: Target,
    /// With `man`: write stemcell-gallery.1 and stemcell-gallery-COMMAND.1 for every command
    /// (stemcell-gallery-COMMAND-SUBCOMMAND.1 for nested ones, e.g. references prune) into DIR
    /// (e.g. /usr/local/share/man/man1) instead of printing the top-level page.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// The command tree the man pages describe: no `help` subcommand at any level (it has no page
/// of its own).
fn man_command() -> clap::Command {
    fn without_help(cmd: clap::Command) -> clap::Command {
        cmd.disable_help_subcommand(true)
            .mut_subcommands(without_help)
    }
    let mut cmd = without_help(Cli::command());
    cmd.build();
    cmd
}

pub fn run(_global: &GlobalArgs, args: CompletionsArgs) -> anyhow::Result<Report> {
    let mut cmd = Cli::command();
    let mut buf = Vec::new();
    let shell = match args.shell {
        Target::Bash => clap_complete::Shell::Bash,
        Target::Zsh => clap_complete::Shell::Zsh,
        Target::Fish => clap_complete::Shell::Fish,
        Target::Elvish => clap_complete::Shell::Elvish,
        Target::Powershell => clap_complete::Shell::PowerShell,
        Target::Man => {
            let cmd = man_command();
            if let Some(dir) = &args.dir {
                return write_man_pages(cmd, dir);
            }
            clap_mangen::Man::new(cmd).render(&mut buf)?;
            return Ok(Report::raw(String::from_utf8(buf)?));
        }
    };
    if args.dir.is_some() {
        return Err(Coded::new(
            Exit::Usage,
            "--dir is for `completions man`; shell completions print on stdout",
        )
        .into());
    }
    clap_complete::generate(shell, &mut cmd, "stemcell-gallery", &mut buf);
    Ok(Report::raw(String::from_utf8(buf)?))
}

/// Write the top-level page and one page per (visible) command at every level into `dir`
/// (`stemcell-gallery-references.1` and `stemcell-gallery-references-prune.1`, ...).
fn write_man_pages(cmd: clap::Command, dir: &std::path::Path) -> anyhow::Result<Report> {
    fn with_subcommands(cmd: &clap::Command, all: &mut Vec<clap::Command>) {
        all.push(cmd.clone());
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            with_subcommands(sub, all);
        }
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
    let mut pages = Vec::new();
    let mut all = Vec::new();
    with_subcommands(&cmd, &mut all);
    for c in all {
        let path = clap_mangen::Man::new(c)
            .generate_to(dir)
            .map_err(|e| anyhow::anyhow!("cannot write a man page into {}: {e}", dir.display()))?;
        pages.push(path.display().to_string());
    }
    let human = format!("wrote {} man pages:\n  {}", pages.len(), pages.join("\n  "));
    Ok(Report::new(
        json!({"dir": dir.display().to_string(), "pages": pages}),
        human,
    ))
}
