//! From the command line to the application context: resolve the settings from the global
//! flags, then build the clients (`app::context`).

use super::GlobalArgs;
use crate::app::Context;
use crate::config::Settings;

/// Resolve settings from `global` and build every client. No request is sent here.
pub fn connect(global: &GlobalArgs) -> anyhow::Result<Context> {
    crate::wiring::connect(Settings::resolve(global)?)
}

/// [`connect`] for one CPI request: the director's CPI-config properties in the request's
/// `context` (a multi-CPI director sends each CPI's own gallery, subscription and credentials
/// there) win over the configuration file, as they do in the Azure CPI. The keys used are
/// logged, never their values.
pub fn connect_for_request(
    global: &GlobalArgs,
    context: &serde_json::Map<String, serde_json::Value>,
) -> anyhow::Result<Context> {
    let from_context = crate::config::context_layer(context)?;
    if let Some(c) = &from_context {
        tracing::info!(
            "using the CPI-config properties the director sent in the request context ({}) over the configuration file",
            c.keys.join(", ")
        );
    }
    let settings =
        Settings::resolve_with_context(global, &|k| std::env::var(k).ok(), from_context.as_ref())?;
    crate::wiring::connect(settings)
}
