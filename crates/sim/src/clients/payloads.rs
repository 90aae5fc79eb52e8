//! External payloads in the workload: some clients start a workflow whose input they uploaded to
//! the runtime transport first (the instance's stored state then names it), and some uploads are
//! never used. At each collection, what an instance names must stay (and still verify), and an
//! upload nothing names must go.

use crate::report::Failure;
use crate::workload::{NAMESPACE, PAYLOAD};
use crate::world::World;
use capstan_app::external_payloads::{self as payloads, Bytes, FetchExpectation, PayloadSettings, UploadDeclaration};
use capstan_app::Services;
use capstan_engine::{Payload, WorkflowId};
use capstan_payloads::BlobStore;
use capstan_store::{ExternalPayloadRecord, PayloadStore, RunLocator, RunStore};
use rand::Rng;
use std::collections::BTreeMap;

/// The uploads clients made: the ones an instance's input names, and the ones never used.
#[derive(Default)]
pub(crate) struct Uploads {
    held: BTreeMap<String, ExternalPayloadRecord>,
    orphans: Vec<ExternalPayloadRecord>,
}

fn settings() -> PayloadSettings {
    // Collected as soon as nothing names it: the sharpest version of the rule.
    PayloadSettings {
        unused_grace_ms: 0,
        ..PayloadSettings::default()
    }
}

fn blob_store(world: &World) -> Result<BlobStore, Failure> {
    BlobStore::local(&world.payloads_dir(), String::new()).map_err(|e| world.fail(format!("blob store: {e}")))
}

async fn upload(world: &World, bytes: Vec<u8>) -> Result<ExternalPayloadRecord, Failure> {
    let store = blob_store(world)?;
    let declared = UploadDeclaration {
        codec: "avro".into(),
        size_bytes: bytes.len() as u64,
        sha256: payloads::sha256_hex(&bytes),
    };
    payloads::upload(&world.app, &settings(), &store, NAMESPACE, declared, Bytes::from(bytes))
        .await
        .map_err(|e| world.fail(format!("upload: {e}")))
}

impl Uploads {
    /// The input of a start: sometimes a reference to bytes the client uploaded first.
    pub(crate) async fn start_input(&mut self, world: &mut World, workflow_id: &str) -> Result<Payload, Failure> {
        if !world.rng.random_bool(0.25) {
            return Ok(Payload::avro(PAYLOAD));
        }
        let record = upload(world, format!("{PAYLOAD}:{workflow_id}").into_bytes()).await?;
        let payload = payloads::reference_payload(&record);
        self.held.insert(workflow_id.to_string(), record);
        Ok(payload)
    }

    /// Sometimes an upload nothing will name; then a collection, and its checks.
    pub(crate) async fn collect(&mut self, world: &mut World) -> Result<(), Failure> {
        if world.rng.random_bool(0.5) {
            let record = upload(world, format!("orphan-{}", world.step).into_bytes()).await?;
            self.orphans.push(record);
        }
        let store = blob_store(world)?;
        let collected = payloads::collect_unused(&world.app, &settings(), |_| Some(store.clone()), 1_000)
            .await
            .map_err(|e| world.fail(format!("collect: {e}")))?;
        world.counters.payloads_collected += collected.deleted as usize;
        let now = world.app.now();
        // An upload is collectable once its (zero) grace has passed: strictly before now.
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.orphans)
            .into_iter()
            .partition(|orphan| orphan.created_at < now);
        self.orphans = later;
        for orphan in due {
            if world
                .store()
                .external_payload(NAMESPACE, &orphan.reference_id)
                .await
                .map_err(|e| world.fail(e.to_string()))?
                .is_some()
            {
                return Err(world.fail(format!(
                    "upload {} is named by nothing and survived a collection",
                    orphan.reference_id
                )));
            }
        }
        self.check_held(world).await
    }

    /// Every payload a start named that the start committed is still served, and verifies.
    pub(crate) async fn check_held(&self, world: &World) -> Result<(), Failure> {
        let store = blob_store(world)?;
        for (workflow_id, record) in self.held.clone() {
            let started = world
                .store()
                .load_run(NAMESPACE, RunLocator::Current(WorkflowId(workflow_id.clone())))
                .await
                .map_err(|e| world.fail(e.to_string()))?
                .is_some();
            if !started {
                // The start was refused or lost: the upload is an orphan like any other.
                continue;
            }
            let expected = FetchExpectation {
                codec: Some(record.codec.clone()),
                size_bytes: Some(record.size_bytes as u64),
                sha256: Some(record.sha256.clone()),
            };
            if let Err(error) = payloads::fetch(&world.app, &store, NAMESPACE, &record.reference_id, &expected).await {
                return Err(world.fail(format!(
                    "{workflow_id}'s input {} is no longer served: {error}",
                    record.reference_id
                )));
            }
        }
        Ok(())
    }
}
