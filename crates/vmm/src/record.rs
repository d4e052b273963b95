//! `ftvm record`: a running VM's inputs written to a log file
//! (`ftvm_replay::recorder`), as the side that runs the VM for a replay to
//! follow.

use crate::api::PairStatus;
use crate::error::{file, VmmError};
use ftvm_machine::{DeterministicEngine, Event};
use ftvm_protection::error::ProtectionError;
use ftvm_protection::primary::{Alone, Primary, Request};
use ftvm_replay::recorder::Recorder;
use ftvm_replay::Header;
use ftvm_replication::channel::Failure;
use std::fs::File;
use std::io::BufWriter;
use std::path::Path;
use std::time::Duration;

/// `ftvm record`: the side that runs the VM for a replay to follow, from
/// a log file. Nothing is held and nobody is waited for.
pub struct Recording(Recorder<BufWriter<File>>);

impl Recording {
    pub fn create(path: &Path, header: &Header) -> Result<Recording, VmmError> {
        let f = File::create(path).map_err(file("cannot create log", path))?;
        let name = path.display().to_string();
        let recorder = Recorder::new(BufWriter::new(f), header, name, None).map_err(file("cannot write log", path))?;
        Ok(Recording(recorder))
    }
}

impl<E: DeterministicEngine> Primary<E> for Recording {
    fn before_run(&mut self, m: &mut E, _paused: bool) -> Result<(), ProtectionError> {
        Ok(self.0.close_frame(m)?)
    }

    fn input(&mut self, icount: u64, ev: Event) -> Option<Event> {
        self.0.event(icount, &ev);
        Some(ev)
    }

    fn gate(&mut self, requests: Vec<Request>, _icount: u64) -> Vec<Request> {
        requests
    }

    fn after_slice(&mut self, _m: &mut E, _busy: Duration, _idle: bool) -> Result<Duration, ProtectionError> {
        Ok(Duration::ZERO)
    }

    fn may_pause(&self) -> bool {
        true
    }

    /// A log file has no peer to lose.
    fn peer_lost(&mut self, _failure: &Failure) -> Result<Alone, ProtectionError> {
        Ok(Alone::default())
    }

    fn status(&mut self) -> Option<PairStatus> {
        None
    }

    fn finish(self: Box<Self>, m: &mut E, status: Option<u32>) -> Result<(), ProtectionError> {
        let synced = |f: BufWriter<File>| {
            let file = f.into_inner().map_err(|e| e.into_error())?;
            file.sync_all()?;
            Ok(file.metadata()?.len())
        };
        Ok(self.0.finish(m, status, synced)?)
    }
}
