//! External payloads in the workload: some clients start a workflow whose input they uploaded to
//! the runtime transport first (the instance's stored state then names it), and some uploads are
//! never used. At each collection, what an instance names must stay (and still verify), and an
//! upload nothing names must go.

use super::*;
use capstan_app::external_payloads::{self as payloads, Bytes, FetchExpectation, PayloadSettings, UploadDeclaration};
use capstan_payloads::BlobStore;
use capstan_store::ExternalPayloadRecord;

/// The uploads clients made: the ones an instance's input names, and the ones never used.
#[derive(Default)]
pub(crate) struct Uploads {
    pub(crate) held: BTreeMap<String, ExternalPayloadRecord>,
    pub(crate) orphans: Vec<ExternalPayloadRecord>,
}

fn settings() -> PayloadSettings {
    // Collected as soon as nothing names it: the sharpest version of the rule.
    PayloadSettings {
        unused_grace_ms: 0,
        ..PayloadSettings::default()
    }
}

impl Sim {
    fn blob_store(&self) -> Result<BlobStore, Failure> {
        BlobStore::local(&self.dir.path().join("payloads"), String::new()).map_err(|e| self.fail(format!("blob store: {e}")))
    }

    async fn upload(&mut self, bytes: Vec<u8>) -> Result<ExternalPayloadRecord, Failure> {
        let store = self.blob_store()?;
        let declared = UploadDeclaration {
            codec: "avro".into(),
            size_bytes: bytes.len() as u64,
            sha256: payloads::sha256_hex(&bytes),
        };
        payloads::upload(&self.app, &settings(), &store, NAMESPACE, declared, Bytes::from(bytes))
            .await
            .map_err(|e| self.fail(format!("upload: {e}")))
    }

    /// The input of a start: sometimes a reference to bytes the client uploaded first.
    pub(crate) async fn start_input(&mut self, workflow_id: &str) -> Result<Payload, Failure> {
        if !self.rng.random_bool(0.25) {
            return Ok(Payload::avro(PAYLOAD));
        }
        let record = self.upload(format!("{PAYLOAD}:{workflow_id}").into_bytes()).await?;
        let payload = payloads::reference_payload(&record);
        self.uploads.held.insert(workflow_id.to_string(), record);
        Ok(payload)
    }

    /// Sometimes an upload nothing will name; then a collection, and its checks.
    pub(crate) async fn collect_payloads(&mut self) -> Result<(), Failure> {
        if self.rng.random_bool(0.5) {
            let record = self.upload(format!("orphan-{}", self.step).into_bytes()).await?;
            self.uploads.orphans.push(record);
        }
        let store = self.blob_store()?;
        let collected = payloads::collect_unused(&self.app, &settings(), |_| Some(store.clone()), 1_000)
            .await
            .map_err(|e| self.fail(format!("collect: {e}")))?;
        self.report.payloads_collected += collected.deleted as usize;
        let now = self.app.now();
        // An upload is collectable once its (zero) grace has passed: strictly before now.
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.uploads.orphans)
            .into_iter()
            .partition(|orphan| orphan.created_at < now);
        self.uploads.orphans = later;
        for orphan in due {
            if self
                .store()
                .external_payload(NAMESPACE, &orphan.reference_id)
                .await
                .map_err(|e| self.fail(e.to_string()))?
                .is_some()
            {
                return Err(self.fail(format!(
                    "upload {} is named by nothing and survived a collection",
                    orphan.reference_id
                )));
            }
        }
        self.check_held_payloads().await
    }

    /// Every payload a start named that the start committed is still served, and verifies.
    pub(crate) async fn check_held_payloads(&mut self) -> Result<(), Failure> {
        let store = self.blob_store()?;
        for (workflow_id, record) in self.uploads.held.clone() {
            let started = self
                .store()
                .load_run(NAMESPACE, RunLocator::Current(WorkflowId(workflow_id.clone())))
                .await
                .map_err(|e| self.fail(e.to_string()))?
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
            if let Err(error) = payloads::fetch(&self.app, &store, NAMESPACE, &record.reference_id, &expected).await {
                return Err(self.fail(format!(
                    "{workflow_id}'s input {} is no longer served: {error}",
                    record.reference_id
                )));
            }
        }
        Ok(())
    }
}
