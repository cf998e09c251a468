//! A worker's conversation for an async caller: the same frames as
//! `WorkerProcess::send` and `WorkerProcess::exchange`, waited for on the
//! runtime's reactor rather than on a thread. Only where
//! `crate::reactor::here`: tokio panics registering a descriptor with a
//! runtime that has no I/O driver.

use std::io;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::Interest;

use super::frame::{RecvError, Waited};
use super::process::{DEATH_WAIT, Death, Outbox, SendError, WorkerProcess};
use super::registered::{Alarm, NoReactor, Registered, Sockets};

impl WorkerProcess {
    /// Registers the worker's frames with the current runtime's reactor,
    /// unless they are already. Only where [`crate::reactor::here`].
    pub fn on_reactor(&mut self) -> io::Result<()> {
        let runtime = tokio::runtime::Handle::try_current().map_err(io::Error::other)?.id();
        if self.reactor.as_ref().is_none_or(|sockets| sockets.runtime != runtime) {
            self.reactor = None;
            let from_worker = Registered::new(&self.frames, Interest::READABLE)?;
            self.reactor = Some(Sockets { runtime, from_worker, to_worker: None, alarm: Alarm::new()? });
        }
        Ok(())
    }

    /// Sets the deadline that [`WorkerProcess::send_async`],
    /// [`WorkerProcess::exchange_async`] and the waits for an exit keep:
    /// `None` for none (an idle worker's alarm is off: it would wake the
    /// reactor for nothing).
    pub fn set_alarm(&mut self, until: Option<Instant>) -> Result<(), NoReactor> {
        self.reactor.as_ref().ok_or(NoReactor)?.alarm.set(until)
    }

    /// Registers the write side with the reactor, unless it is already
    /// (see [`Sockets::to_worker`]).
    fn watch_room(&mut self) -> Result<&Sockets, NoReactor> {
        let sockets = self.reactor.as_mut().ok_or(NoReactor)?;
        if sockets.to_worker.is_none() {
            sockets.to_worker = Some(Registered::new(&self.to_worker, Interest::WRITABLE).map_err(|_| NoReactor)?);
        }
        Ok(sockets)
    }

    /// Waits on the reactor for room to write to the worker: false if the
    /// alarm rang first.
    async fn room(&mut self) -> Result<bool, NoReactor> {
        let sockets = self.watch_room()?;
        let to_worker = sockets.to_worker.as_ref().ok_or(NoReactor)?;
        tokio::select! {
            biased;
            room = to_worker.wait(Interest::WRITABLE) => room.map(|()| true),
            rung = sockets.alarm.rung() => rung.map(|()| false),
        }
    }

    /// [`WorkerProcess::send`] for an async caller, after
    /// [`WorkerProcess::on_reactor`]: the frame goes out as the worker
    /// makes room, until the alarm ([`WorkerProcess::set_alarm`]) rings. A
    /// frame cut short makes the worker unusable, as
    /// [`SendError::TimedOut`] says; so does one cut short by
    /// [`NoReactor`].
    pub async fn send_async(&mut self, message: &impl Serialize) -> Result<Result<(), SendError>, NoReactor> {
        let mut outbox = Outbox::default();
        if outbox.push(message).is_err() {
            return Ok(Err(SendError::Closed { written: 0 }));
        }
        loop {
            outbox.write_some(&self.to_worker);
            if outbox.closed {
                return Ok(Err(SendError::Closed { written: outbox.written }));
            }
            if outbox.len() == 0 {
                return Ok(Ok(()));
            }
            if !self.room().await? {
                return Ok(Err(SendError::TimedOut));
            }
        }
    }

    /// [`WorkerProcess::exchange`] for an async caller: the next frame,
    /// meanwhile writing `outbox` as the worker makes room, or `Ok(None)`
    /// as soon as `wake` is ready (the caller has frames to add and clears
    /// `wake`), or [`RecvError::TimedOut`] once the alarm
    /// ([`WorkerProcess::set_alarm`]) rings. Cancel-safe: a
    /// partial frame read so far is kept for the next call, and the outbox
    /// knows what it wrote.
    pub async fn exchange_async<T: DeserializeOwned>(
        &mut self,
        outbox: &mut Outbox,
        wake: Option<&Registered>,
        max: usize,
    ) -> Result<Result<Option<T>, RecvError>, NoReactor> {
        loop {
            outbox.write_some(&self.to_worker);
            // Reads what is there, without waiting.
            match self.frames.recv_or(None, max, |_, _| Waited::Interrupted) {
                Ok(None) => {}
                heard => return Ok(heard),
            }
            let wants_room = outbox.wants_room();
            if wants_room {
                self.watch_room()?;
            }
            let sockets = self.reactor.as_ref().ok_or(NoReactor)?;
            let woken = async {
                match wake {
                    Some(wake) => wake.wait(Interest::READABLE).await,
                    None => std::future::pending().await,
                }
            };
            let room = async {
                match &sockets.to_worker {
                    Some(to_worker) if wants_room => to_worker.wait(Interest::WRITABLE).await,
                    _ => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                woken = woken => return woken.map(|()| Ok(None)),
                readable = sockets.from_worker.wait(Interest::READABLE) => readable?,
                room = room => room?,
                rung = sockets.alarm.rung() => return rung.map(|()| Err(RecvError::TimedOut)),
            }
        }
    }

    /// Reaps a worker that [`WorkerProcess::stop`] signalled, once it has
    /// exited, waiting for that on the reactor (a worker not stopped is
    /// left alone). If it has not exited within [`REAP_WAIT`] (stuck in the
    /// kernel), reaping is left to its drop.
    pub async fn reap_async(&mut self) {
        if self.stopped && self.status.is_none() && self.exit_async(REAP_WAIT).await {
            self.status = self.child.try_wait().ok().flatten();
        }
    }

    /// [`WorkerProcess::death`] for an async caller: its wait for the exit
    /// is on the reactor.
    pub async fn death_async(&mut self) -> Death {
        let exited = self.status.is_some() || self.exit_async(DEATH_WAIT).await;
        self.death_after(exited)
    }

    /// Waits on the reactor, at most `limit`, until the worker has exited
    /// (true). Does not reap it. Without a reactor to wait on, waits on
    /// this thread (a stopped worker exits at once).
    async fn exit_async(&mut self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        let exit = Registered::new(&self.handle, Interest::READABLE);
        let waited = match (exit, self.set_alarm(Some(until)), self.reactor.as_ref()) {
            (Ok(exit), Ok(()), Some(sockets)) => tokio::select! {
                biased;
                exited = exit.wait(Interest::READABLE) => exited.map(|()| true),
                rung = sockets.alarm.rung() => rung.map(|()| false),
            },
            _ => Err(NoReactor),
        };
        waited.unwrap_or_else(|NoReactor| self.handle.wait_exit(Some(until)))
    }
}

/// How long a stopped worker may take to exit before its reaping is left to
/// its drop ([`WorkerProcess::reap_async`]).
const REAP_WAIT: Duration = Duration::from_secs(1);
