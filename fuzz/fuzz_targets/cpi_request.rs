//! The BOSH CPI request parser and what `cpi` does with a request before any I/O (the plan):
//! any bytes give a request or an InvalidCall error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stemcell_gallery::cpi::handler::{plan, Plan};
use stemcell_gallery::cpi::protocol::{parse_request, ErrorType, Response};

fuzz_target!(|data: &[u8]| {
    let req = match parse_request(data) {
        Ok(r) => r,
        Err(e) => {
            assert_eq!(e.kind, ErrorType::InvalidCall);
            assert!(!e.message.is_empty());
            // The error response must encode.
            serde_json::to_string(&Response::err(&e, String::new())).expect("encodes");
            return;
        }
    };
    for delegating in [false, true] {
        if let Plan::Refuse(e) = plan(&req, delegating) {
            assert!(!e.message.is_empty());
            serde_json::to_string(&Response::err(&e, String::new())).expect("encodes");
        }
    }
});
