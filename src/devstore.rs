//! Ground floor: the well-known development credentials shared by the emulator (which accepts
//! them) and `config` (which sends them with `--auth emulator` or to Azurite). Public values,
//! documented where they come from; nothing else of the tool lives here, so the emulator can link
//! this module and nothing else.

/// Well-known development bearer token the emulator accepts (`--auth emulator`).
pub const EMULATOR_TOKEN: &str = "stemcell-gallery-emulator-dev-token";
/// Azurite's well-known development account and key (public, documented by Microsoft).
pub const DEV_ACCOUNT: &str = "devstoreaccount1";
pub const DEV_ACCOUNT_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
