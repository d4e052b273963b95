//! The control socket of a running VM (`--control PATH`): a Unix socket
//! taking one request per connection, one JSON line each way (the types
//! are `api`'s). It is how tools, and a daemon driving VMs, pause,
//! snapshot, resume and ask the status of a VM that is running.
//!
//! `ftvm control SOCKET status` sends `{"request":"status"}` and prints
//! the reply's readable form (`--json`: the line itself). A line that is
//! not JSON is taken as a command in words (`status`, `snapshot FILE`) and
//! answered in the readable form, for a person at `socat` or a script
//! that wants the status line.

use crate::api::{ControlError, Reply, Request, Response};
use crate::attach::ConsoleHub;
use crate::host_io::HostEvent;
pub use ftvm_api::client::{attach_console, follow_events, send, ControlSocketError};
pub use ftvm_api::words::parse;
use ftvm_protection::events::{EventRecord, Events};
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Sender};
use std::time::Duration;

/// Longest request line taken: a snapshot path is the longest thing in one.
const MAX_REQUEST: u64 = 64 << 10;
/// Connections served at once (each is a thread, and `events` ones last):
/// beyond, a client is told the socket is busy.
const MAX_CONNECTIONS: usize = 32;
/// How long a connection may take to send its request, or to take what
/// is written to it, before it is closed.
const CONNECTION_WAIT: Duration = Duration::from_secs(10);

/// A request on its way to the live loop, with where its answer goes.
pub struct ControlRequest {
    pub request: Request,
    pub reply: Sender<Response>,
}

/// Removes the socket file (and its registration for `ftvm list`) when
/// the VM ends.
pub struct ControlSocket {
    path: PathBuf,
    _registration: Option<crate::registry::Registration>,
    /// Requests answered but whose answer is not written yet.
    answering: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

/// How long a VM that ends waits for the answers it gave to be written
/// (`quit`'s own answer: the process would otherwise exit before the
/// connection's thread writes it, and the client see no answer).
const ANSWERS_WAIT: Duration = Duration::from_secs(1);

impl Drop for ControlSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let until = std::time::Instant::now() + ANSWERS_WAIT;
        while self.answering.load(std::sync::atomic::Ordering::Acquire) > 0 && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// Listens on `path`, forwarding requests to the live loop; `journal`
/// answers `events`, `console` attaches consoles.
pub fn listen(
    path: &Path,
    host_events: Sender<HostEvent>,
    journal: Events,
    console: ConsoleHub,
) -> Result<ControlSocket, ControlSocketError> {
    let host_events = std::sync::Mutex::new(host_events);
    serve(path, journal, console, move |request| {
        let (tx, rx) = mpsc::channel();
        let request = HostEvent::Control(ControlRequest { request, reply: tx });
        if host_events.lock().unwrap().send(request).is_err() {
            return Response::Error(ControlError::Stopped);
        }
        rx.recv().unwrap_or(Response::Error(ControlError::Stopped))
    })
}

/// Listens on `path`, answering each command with `answer`. The socket
/// file goes when the returned value is dropped (and with it any way to
/// connect), so another listener may take the path over.
pub fn serve(
    path: &Path,
    journal: Events,
    console: ConsoleHub,
    answer: impl Fn(Request) -> Response + Send + Sync + 'static,
) -> Result<ControlSocket, ControlSocketError> {
    // A socket file left by a VM that was killed would make bind fail; one
    // that still answers belongs to a live VM and must not be taken over.
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(ControlSocketError::InUse(path.to_path_buf()));
        }
        let _ = std::fs::remove_file(path);
    }
    let listener =
        UnixListener::bind(path).map_err(|source| ControlSocketError::Create { path: path.to_path_buf(), source })?;
    let answer = std::sync::Arc::new(answer);
    let open = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let answering = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let answering_ = answering.clone();
    std::thread::spawn(move || {
        let answering = answering_;
        for mut conn in listener.incoming().flatten() {
            use std::sync::atomic::Ordering;
            let _ = conn.set_write_timeout(Some(CONNECTION_WAIT));
            if open.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
                open.fetch_sub(1, Ordering::AcqRel);
                let busy = serde_json::to_string(&Response::Error(ControlError::Busy)).expect("a response serializes");
                let _ = writeln!(conn, "{busy}");
                continue;
            }
            let (answer, journal, place) = (answer.clone(), journal.clone(), open.clone());
            let (answering, console) = (answering.clone(), console.clone());
            let served = std::thread::Builder::new().name("ftvm-control".into()).spawn(move || {
                serve_one(conn, &journal, &console, &*answer, &answering);
                place.fetch_sub(1, Ordering::AcqRel);
            });
            if served.is_err() {
                // No thread to be had: the connection was dropped, and
                // with it its place.
                open.fetch_sub(1, Ordering::AcqRel);
            }
        }
    });
    tracing::debug!(socket = %path.display(), "control socket listening");
    Ok(ControlSocket { path: path.to_path_buf(), _registration: crate::registry::register(path), answering })
}

fn serve_one(
    conn: UnixStream,
    journal: &Events,
    console: &ConsoleHub,
    answer: &dyn Fn(Request) -> Response,
    answering: &std::sync::atomic::AtomicUsize,
) {
    use std::sync::atomic::Ordering;
    let _ = conn.set_read_timeout(Some(CONNECTION_WAIT));
    let mut line = Vec::new();
    let Ok(mut writer) = conn.try_clone() else { return };
    // Read to the newline, but never more than a request can be: the
    // rest of a longer line stays unread in the socket, and goes with it.
    // (A byte at a time: what a console client types after its request
    // must stay in the socket for the console.)
    let mut reader = conn;
    let mut byte = [0u8; 1];
    while line.len() as u64 <= MAX_REQUEST {
        match reader.read(&mut byte) {
            Ok(1) => {
                line.push(byte[0]);
                if byte[0] == b'\n' {
                    break;
                }
            }
            Ok(_) if !line.is_empty() => break,
            _ => return,
        }
    }
    let json = line.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    if line.len() as u64 > MAX_REQUEST {
        let e = Response::Error(ControlError::TooLong(MAX_REQUEST));
        let text = if json { serde_json::to_string(&e).expect("a response serializes") } else { e.to_string() };
        let _ = writeln!(writer, "{text}");
        return;
    }
    let line = String::from_utf8_lossy(&line);
    let request = match json {
        true => serde_json::from_str::<Request>(&line)
            .map_err(|e| ControlError::BadRequest(format!("unreadable request: {e}"))),
        false => parse(&line),
    }
    .and_then(|r| r.check().map(|()| r).map_err(ControlError::BadRequest));
    let response = match request {
        Ok(Request::Events) => return stream_events(writer, journal, json),
        Ok(Request::Console { read_only }) => return stream_console(reader, writer, console, !read_only, json),
        Ok(request) => {
            answering.fetch_add(1, Ordering::AcqRel);
            let r = answer(request);
            let text = write_response(&r, json);
            let _ = writeln!(writer, "{text}");
            answering.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        Err(e) => Response::Error(e),
    };
    let _ = writeln!(writer, "{}", write_response(&response, json));
}

fn write_response(response: &Response, json: bool) -> String {
    match json {
        true => serde_json::to_string(response).expect("a response serializes"),
        false => response.to_string(),
    }
}

/// Writes the journal's events so far, then each as it comes, until the
/// client hangs up: as JSON lines, or in words (`seq time event`).
fn stream_events(mut writer: UnixStream, journal: &Events, json: bool) {
    let (history, rx) = journal.subscribe();
    let line = |r: &EventRecord| match json {
        true => serde_json::to_string(r).expect("an event serializes"),
        false => format!("{} {} {r}", r.seq, r.unix_ms),
    };
    for r in history.into_iter().chain(rx) {
        if writeln!(writer, "{}", line(&r)).is_err() {
            return;
        }
    }
}

/// Attaches the connection to the console: the reply line, then the
/// console's backlog and output until either side goes; what the client
/// sends is typed (if it types).
fn stream_console(reader: UnixStream, mut writer: UnixStream, console: &ConsoleHub, types: bool, json: bool) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let attachment = match console.attach(types) {
        Ok(a) => a,
        Err(e) => {
            let _ =
                writeln!(writer, "{}", write_response(&Response::Error(ControlError::Console(e.to_string())), json));
            return;
        }
    };
    let reply = Response::Ok(Reply::Console { typing: attachment.keys.types });
    if writeln!(writer, "{}", write_response(&reply, json)).is_err() || writer.write_all(&attachment.backlog).is_err() {
        return;
    }
    // The console waits on a person: no deadline on reading them, and a
    // write that cannot go for a while means a client that stopped reading.
    let _ = reader.set_read_timeout(None);
    let gone = std::sync::Arc::new(AtomicBool::new(false));
    let typing = {
        let (keys, gone) = (attachment.keys.clone(), gone.clone());
        std::thread::Builder::new().name("ftvm-console-in".into()).spawn(move || {
            let mut reader = reader;
            let mut buf = [0u8; 1024];
            loop {
                match reader.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) if keys.type_bytes(&buf[..n]) => {}
                    Ok(_) => break,
                }
            }
            keys.leave();
            gone.store(true, Ordering::Release);
        })
    };
    while !gone.load(Ordering::Acquire) {
        match attachment.output.recv_timeout(Duration::from_millis(200)) {
            Ok(piece) => {
                if writer.write_all(&piece).is_err() {
                    break;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let _ = writer.shutdown(std::net::Shutdown::Both);
    if let Ok(t) = typing {
        let _ = t.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};

    /// `protect` takes `ftvm ft primary`'s options, typed; a mistake is
    /// one line saying what is wrong.
    #[test]
    fn protect_reads_the_primary_options_and_refuses_in_one_line() {
        let Ok(Request::Protect(args)) = parse("protect --backup 10.0.0.2:7700 --shared /srv/ft --mode epoch") else {
            panic!("not a protect request")
        };
        assert_eq!(args.backup, "10.0.0.2:7700".parse().unwrap());
        assert_eq!(args.pair.shared, Some(PathBuf::from("/srv/ft")));
        assert_eq!(args.mode, ftvm_protection::pair::Mode::Epoch);
        let json = serde_json::to_string(&Request::Protect(args.clone())).unwrap();
        assert_eq!(serde_json::from_str::<Request>(&json).unwrap(), Request::Protect(args));
        for bad in ["protect --shared /srv/ft", "protect --backup nowhere --shared /srv/ft"] {
            let Err(ControlError::BadRequest(why)) = parse(bad) else { panic!("{bad} was taken") };
            assert!(why.starts_with("protect: ") && !why.contains('\n'), "{why}");
        }
    }
    use crate::api::{PairStatus, Reply, RunState, VmStatus};

    #[test]
    fn commands() {
        assert_eq!(parse("status\n").unwrap(), Request::Status);
        assert_eq!(
            parse(" snapshot /tmp/a b.snap ").unwrap(),
            Request::Snapshot { path: "/tmp/a b.snap".into(), overwrite: false }
        );
        assert_eq!(
            parse("snapshot --overwrite /tmp/a.snap").unwrap(),
            Request::Snapshot { path: "/tmp/a.snap".into(), overwrite: true }
        );
        assert!(parse("snapshot").is_err());
        assert!(parse("snapshot --overwrite").is_err());
        assert_eq!(parse("timeout 2000").unwrap(), Request::Timeout { ms: 2000 });
        for bad in ["timeout", "timeout 10", "timeout 60001", "timeout 2s", "timeout -5"] {
            assert!(parse(bad).unwrap_err().to_string().contains("20 to 60000 ms"), "{bad}");
        }
        assert_eq!(parse("cpu-limit 40").unwrap(), Request::CpuLimit { percent: 40 });
        for bad in ["cpu-limit", "cpu-limit 4", "cpu-limit 101", "cpu-limit 256", "cpu-limit 50%", "cpu-limit -5"] {
            assert!(parse(bad).unwrap_err().to_string().contains("5 to 100 %"), "{bad}");
        }
        // A typed request is checked the same way, at the socket.
        assert_eq!(
            Request::CpuLimit { percent: 4 }.check().unwrap_err(),
            "a CPU limit of 4 % is out of range (5 to 100 %)"
        );
        assert_eq!(
            Request::Timeout { ms: 19 }.check().unwrap_err(),
            "a timeout of 19 ms is out of range (20 to 60000 ms)"
        );
        assert!(Request::CpuLimit { percent: 100 }.check().is_ok() && Request::Timeout { ms: 20 }.check().is_ok());
        // An unknown command is quoted, but not whole.
        let long = format!("x{}", "y".repeat(10_000));
        assert!(parse(&long).unwrap_err().to_string().len() < 300);
        assert!(parse("pause now").is_err());
        assert!(parse("reboot").unwrap_err().to_string().contains("unknown command"));
    }

    #[test]
    fn requests_and_responses_are_json_lines_that_round_trip() {
        let r = Request::Snapshot { path: "/tmp/x.snap".into(), overwrite: false };
        let line = serde_json::to_string(&r).unwrap();
        assert_eq!(line, r#"{"request":"snapshot","path":"/tmp/x.snap","overwrite":false}"#);
        assert_eq!(serde_json::from_str::<Request>(&line).unwrap(), r);
        // Overwriting is asked for, never assumed.
        assert_eq!(serde_json::from_str::<Request>(r#"{"request":"snapshot","path":"/tmp/x.snap"}"#).unwrap(), r);
        assert_eq!(serde_json::from_str::<Request>(r#"{"request":"status"}"#).unwrap(), Request::Status);
        assert!(serde_json::from_str::<Request>(r#"{"request":"reboot"}"#).is_err());
        assert!(serde_json::from_str::<Request>("status").is_err());
        let status = VmStatus {
            state: RunState::Running,
            icount: 42,
            guest_time_s: Some(1.5),
            pair: Some(PairStatus::Unprotected),
            cpu_limit_percent: None,
        };
        let response = Response::Ok(Reply::Status(Box::new(status)));
        let line = serde_json::to_string(&response).unwrap();
        assert_eq!(serde_json::from_str::<Response>(&line).unwrap(), response);
        assert_eq!(response.to_string(), "ok running icount=42 time=1.500s role=primary backup=none (unprotected)");
        let refused = Response::Error(ControlError::ProtectedCannotPause);
        let line = serde_json::to_string(&refused).unwrap();
        assert_eq!(line, r#"{"error":{"error":"protected_cannot_pause"}}"#);
        assert_eq!(refused.to_string(), "error a protected VM cannot be paused (its backup would take over)");
    }

    /// A typed `protect` names only what it changes: an option left out
    /// takes the value the command line gives it when left out, so that a
    /// client written before an option existed still protects a VM.
    #[test]
    fn a_typed_protect_takes_the_command_lines_defaults() {
        let words = parse("protect --backup 10.0.0.2:7700 --shared /srv/ft").unwrap();
        let typed = r#"{"request":"protect","backup":"10.0.0.2:7700","pair":{"shared":"/srv/ft"}}"#;
        assert_eq!(serde_json::from_str::<Request>(typed).unwrap(), words);
        let words = parse("protect --backup 10.0.0.2:7700 --shared /srv/ft --mode checkpoint --timeout 800").unwrap();
        let typed = r#"{"request":"protect","backup":"10.0.0.2:7700","mode":"checkpoint","pair":{"shared":"/srv/ft","timeout":800}}"#;
        assert_eq!(serde_json::from_str::<Request>(typed).unwrap(), words);
        // What must be given still must be, and a name it does not know
        // is still refused.
        assert!(serde_json::from_str::<Request>(r#"{"request":"protect","pair":{"shared":"/srv/ft"}}"#).is_err());
        let unknown = r#"{"request":"protect","backup":"10.0.0.2:7700","pair":{"shared":"/s"},"lag":5}"#;
        assert!(serde_json::from_str::<Request>(unknown).is_err());
    }

    #[test]
    fn the_socket_answers_json_with_json_and_words_with_the_readable_form() {
        let dir = std::env::temp_dir().join(format!("ftvm-control-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("vm.sock");
        let _socket = serve(&path, Events::default(), ConsoleHub::default(), |request| match request {
            Request::Status => Response::Ok(Reply::Status(Box::new(VmStatus {
                state: RunState::Paused,
                icount: 7,
                guest_time_s: Some(0.25),
                pair: None,
                cpu_limit_percent: Some(40),
            }))),
            _ => Response::Error(ControlError::Stopped),
        })
        .unwrap();
        let ask = |line: &str| {
            let mut s = UnixStream::connect(&path).unwrap();
            writeln!(s, "{line}").unwrap();
            let mut reply = String::new();
            BufReader::new(s).read_line(&mut reply).unwrap();
            reply.trim_end().to_string()
        };
        assert_eq!(ask("status"), "ok paused icount=7 time=0.250s cpu_limit=40%");
        assert_eq!(ask("quit"), "error the VM has stopped");
        assert!(ask("reboot").starts_with("error unknown command 'reboot'"));
        let (response, line) = send(&path, &Request::Status, Duration::from_secs(10)).unwrap();
        assert!(line.starts_with(r#"{"ok":{"reply":"status","state":"paused","icount":7,"#), "{line}");
        assert_eq!(response.to_string(), "ok paused icount=7 time=0.250s cpu_limit=40%");
        assert!(ask(r#"{"request":"reboot"}"#)
            .starts_with(r#"{"error":{"error":"bad_request","message":"unreadable request"#));
        // A typed request out of range never reaches the VM (which would
        // answer "stopped" here).
        assert_eq!(
            ask(r#"{"request":"cpu_limit","percent":200}"#),
            r#"{"error":{"error":"bad_request","message":"a CPU limit of 200 % is out of range (5 to 100 %)"}}"#
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// What a hostile or broken client can do: a line far over the limit
    /// (never read whole, never echoed), and more connections than the
    /// socket serves at once (the rest told it is busy at once, and a
    /// place freed when one goes).
    #[test]
    fn long_lines_and_connection_floods_are_bounded() {
        let dir = std::env::temp_dir().join(format!("ftvm-control-flood-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("vm.sock");
        let _socket = serve(&path, Events::default(), ConsoleHub::default(), |_| Response::Ok(Reply::Running)).unwrap();
        // 4 MiB with no newline: answered after 64 KiB, the rest unread.
        let mut s = UnixStream::connect(&path).unwrap();
        let writer = {
            let mut w = s.try_clone().unwrap();
            std::thread::spawn(move || {
                let chunk = vec![b'a'; 1 << 20];
                (0..4).take_while(|_| w.write_all(&chunk).is_ok()).count()
            })
        };
        let mut reply = String::new();
        BufReader::new(&mut s).read_line(&mut reply).unwrap();
        assert_eq!(reply.trim_end(), format!("error the request is longer than {MAX_REQUEST} bytes"));
        drop(s);
        assert!(writer.join().unwrap() < 4, "the socket read all 4 MiB");
        // Connections that say nothing hold their places...
        let idle: Vec<UnixStream> = (0..MAX_CONNECTIONS).map(|_| UnixStream::connect(&path).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(200));
        let (response, _) = send(&path, &Request::Resume, Duration::from_secs(10)).unwrap();
        assert_eq!(response, Response::Error(ControlError::Busy));
        // ...until they go.
        drop(idle);
        let t0 = std::time::Instant::now();
        loop {
            let (response, _) = send(&path, &Request::Resume, Duration::from_secs(10)).unwrap();
            if response == Response::Ok(Reply::Running) {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "no place freed: {response:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn events_stream_the_journal_so_far_then_each_event_as_it_comes() {
        use ftvm_protection::events::PairEvent;
        let dir = std::env::temp_dir().join(format!("ftvm-control-events-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("vm.sock");
        let journal = Events::default();
        journal.emit(PairEvent::Listening { address: "10.0.0.2:7700".into() });
        let _socket =
            serve(&path, journal.clone(), ConsoleHub::default(), |_| Response::Error(ControlError::Stopped)).unwrap();
        let (tx, rx) = mpsc::channel();
        {
            let path = path.clone();
            std::thread::spawn(move || {
                let _ = follow_events(&path, true, |line| {
                    let _ = tx.send(line.to_string());
                });
            });
        }
        let first: EventRecord = serde_json::from_str(&rx.recv_timeout(Duration::from_secs(10)).unwrap()).unwrap();
        assert_eq!((first.seq, first.event), (1, PairEvent::Listening { address: "10.0.0.2:7700".into() }));
        journal.emit(PairEvent::ArbiterWon { generation: 4 });
        let next: EventRecord = serde_json::from_str(&rx.recv_timeout(Duration::from_secs(10)).unwrap()).unwrap();
        assert_eq!((next.seq, next.event), (2, PairEvent::ArbiterWon { generation: 4 }));
        // In words: place, time, then the event.
        let mut s = UnixStream::connect(&path).unwrap();
        writeln!(s, "events").unwrap();
        let words: Vec<String> = BufReader::new(s).lines().take(2).map(|l| l.unwrap()).collect();
        assert!(
            words[1].starts_with("2 ") && words[1].ends_with(r#"{"event":"arbiter_won","generation":4}"#),
            "{words:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
