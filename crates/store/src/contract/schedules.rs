//! Schedules: created, changed, fired, listed.

use crate::backend::Backend;
use crate::schedules;
use crate::*;

/// Schedules: their rows, firings and audit history.
pub trait ScheduleStore: Backend {
    /// Stores a new schedule and its first events. A live schedule with the id is refused
    /// (`schedule_already_exists`); a deleted one is replaced and its history continues.
    fn create_schedule(&self, schedule: capstan_engine::schedule::Schedule) -> impl Future<Output = StoreResult<()>> + Send {
        let env = self.env().clone();
        self.write(move |tx| Box::pin(async move { schedules::create_schedule(tx, schedule, &env).await }))
    }

    /// A live (not deleted) schedule.
    fn schedule(
        &self,
        namespace: &str,
        schedule_id: &str,
    ) -> impl Future<Output = StoreResult<Option<capstan_engine::schedule::Schedule>>> + Send {
        let (namespace, schedule_id) = (namespace.to_string(), schedule_id.to_string());
        self.read(move |tx| Box::pin(async move { schedules::schedule(tx, &namespace, &schedule_id).await }))
    }

    /// Live schedules of a namespace, newest first.
    fn list_schedules(
        &self,
        namespace: &str,
        filter: ScheduleFilter,
    ) -> impl Future<Output = StoreResult<Vec<capstan_engine::schedule::Schedule>>> + Send {
        let namespace = namespace.to_string();
        self.read(move |tx| Box::pin(async move { schedules::list_schedules(tx, &namespace, &filter).await }))
    }

    /// Applies an engine change to a live schedule (update, pause, resume, delete) and appends
    /// the events it recorded, in one transaction. Missing → `schedule_not_found`.
    fn change_schedule<T: Send + 'static>(
        &self,
        namespace: &str,
        schedule_id: &str,
        change: impl FnOnce(&mut capstan_engine::schedule::Schedule) -> Result<T, Refusal> + Send + 'static,
    ) -> impl Future<Output = StoreResult<T>> + Send {
        let (namespace, schedule_id) = (namespace.to_string(), schedule_id.to_string());
        let env = self.env().clone();
        self.write(move |tx| Box::pin(async move { schedules::change_schedule(tx, &namespace, &schedule_id, change, &env).await }))
    }

    /// Fires a schedule in one transaction with the workflows it starts (see `ScheduleFire`).
    /// `empty_input` is the payload of a start without input.
    fn fire_schedule(
        &self,
        namespace: &str,
        schedule_id: &str,
        fire: ScheduleFire,
        empty_input: Payload,
        now: Millis,
    ) -> impl Future<Output = StoreResult<FireReport>> + Send {
        let (namespace, schedule_id) = (namespace.to_string(), schedule_id.to_string());
        let env = self.env().clone();
        self.write(move |tx| {
            Box::pin(async move { schedules::fire_schedule(tx, &namespace, &schedule_id, &fire, &empty_input, now, &env).await })
        })
    }

    /// Schedules with something to do at `now` (a due occurrence or a waiting buffer).
    fn due_schedules(&self, now: Millis, limit: usize) -> impl Future<Output = StoreResult<Vec<(String, String)>>> + Send {
        self.read(move |tx| Box::pin(async move { schedules::due_schedules(tx, now, limit).await }))
    }

    /// The earliest future fire time over all schedules.
    fn next_schedule_wake(&self) -> impl Future<Output = StoreResult<Option<Millis>>> + Send {
        self.read(move |tx| Box::pin(async move { schedules::next_schedule_wake(tx).await }))
    }

    /// A schedule's audit events after `after_sequence`, oldest first (at most `limit`); None if
    /// the id never existed in the namespace. Deleted schedules keep their history.
    fn schedule_history(
        &self,
        namespace: &str,
        schedule_id: &str,
        after_sequence: i64,
        limit: usize,
    ) -> impl Future<Output = StoreResult<Option<Vec<ScheduleEventRecord>>>> + Send {
        let (namespace, schedule_id) = (namespace.to_string(), schedule_id.to_string());
        self.read(move |tx| Box::pin(async move { schedules::schedule_history(tx, &namespace, &schedule_id, after_sequence, limit).await }))
    }
}

impl<B: Backend> ScheduleStore for B {}
