#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| capstan_server::fuzzing::workflow_commands(data));
