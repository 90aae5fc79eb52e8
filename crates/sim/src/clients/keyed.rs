//! How clients send a keyed command (one with a request id): sometimes twice, its first answer
//! lost, and how the answers are judged: a retry must be answered from the first application's
//! receipt, and nothing is applied twice.

use crate::report::Failure;
use crate::world::World;
use capstan_app::{control, AppError};
use rand::Rng;
use serde_json::Value;

/// How often a keyed client command is sent: sometimes twice (the first response was lost).
pub(crate) fn sends(world: &mut World) -> usize {
    if world.rng.random_bool(0.3) {
        2
    } else {
        1
    }
}

/// Judges the answers to the sends of one keyed command, in order: a retry must be answered
/// from the first application's receipt; a second application, or a receipt with no
/// application before it, fails the seed. Returns the application's receipt body and the
/// bodies the retries got (None: refused).
pub(crate) fn judge_keyed(
    world: &mut World,
    what: &str,
    request_id: &str,
    answers: Vec<Result<control::Receipt, AppError>>,
) -> Result<Option<(Value, Vec<Value>)>, Failure> {
    let mut applied: Option<Value> = None;
    let mut receipts = Vec::new();
    for answer in answers {
        match world.declined(answer)? {
            None => {}
            Some(receipt) if !receipt.retained && applied.is_some() => {
                return Err(world.fail(format!("{what} request {request_id} was applied twice")))
            }
            Some(receipt) if !receipt.retained => {
                let run = receipt
                    .run
                    .ok_or_else(|| world.fail(format!("a fresh {what} came without its run")))?;
                world.seen.acknowledge(&run);
                applied = Some(receipt.body);
            }
            Some(receipt) if applied.is_none() => {
                return Err(world.fail(format!(
                    "{what} request {request_id} has a receipt ({}) but was never applied",
                    receipt.body
                )))
            }
            Some(receipt) => receipts.push(receipt.body),
        }
    }
    Ok(applied.map(|body| (body, receipts)))
}
