//! `completions SHELL`: shell completions, or `man` for a roff man page.

use clap::{Args, CommandFactory, ValueEnum};

use super::{Cli, GlobalArgs, Report};

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
            clap_mangen::Man::new(cmd).render(&mut buf)?;
            return Ok(Report::raw(String::from_utf8(buf)?));
        }
    };
    clap_complete::generate(shell, &mut cmd, "stemcell-gallery", &mut buf);
    Ok(Report::raw(String::from_utf8(buf)?))
}
