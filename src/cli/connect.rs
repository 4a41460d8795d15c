//! From the command line to the application context: resolve the settings from the global
//! flags, then build the clients (`app::context`).

use super::GlobalArgs;
use crate::app::Connected;
use crate::config::Settings;

/// Resolve settings from `global` and build every client. No request is sent here.
pub fn connect(global: &GlobalArgs) -> anyhow::Result<Connected> {
    crate::app::connect(Settings::resolve(global)?)
}
