//! The two ends together, over loopback.

use super::sender::SEND_BATCH;
use super::*;
use crate::fence::Fence;
use crate::pair_key::PairKey;
use crate::Timing;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

fn key() -> PairKey {
    PairKey::from_bytes([0x5a; 32])
}

/// A backup's end waiting on a fresh loopback port: the port, and the
/// end once a primary has connected.
fn backup_on_loopback(buffer: usize) -> (SocketAddr, std::thread::JoinHandle<LogReceiver>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    (addr, std::thread::spawn(move || LogReceiver::accept(&listener, buffer, &key(), |_, _| {}).unwrap()))
}

/// A primary's end connected to `addr`, and what it learns.
fn primary_to(addr: SocketAddr, timing: Timing) -> (LogSender, mpsc::Receiver<PrimaryEvent>) {
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    let (stream, session) = connect(addr, Duration::from_secs(5), &key()).unwrap();
    let sender = LogSender::over(stream, session, DEFAULT_BUFFER, timing, None, Fence::leased(), move |e| {
        let _ = tx.lock().unwrap().send(e);
    })
    .unwrap();
    (sender, rx)
}

/// A primary connected to a backup that started but holds its
/// acknowledgements (not ready), the header written.
fn header_sent_acks_held() -> (LogSender, mpsc::Receiver<PrimaryEvent>, LogReceiver) {
    let (addr, acc) = backup_on_loopback(1 << 20);
    let (mut s, prx) = primary_to(addr, Timing::DEFAULT);
    let r = acc.join().unwrap();
    r.hold_acks();
    r.start(Timing::DEFAULT, |_| {}).unwrap();
    s.write_all(b"header").unwrap();
    (s, prx, r)
}

fn pair(
    buffer: usize,
    timing: Timing,
) -> (LogSender, mpsc::Receiver<PrimaryEvent>, LogReceiver, mpsc::Receiver<Failure>) {
    let (addr, acc) = backup_on_loopback(buffer);
    let (sender, prx) = primary_to(addr, timing);
    let receiver = acc.join().unwrap();
    let (btx, brx) = mpsc::channel();
    let btx = Mutex::new(btx);
    receiver
        .start(timing, move |f| {
            let _ = btx.lock().unwrap().send(f);
        })
        .unwrap();
    (sender, prx, receiver, brx)
}

#[test]
fn small_writes_wait_to_be_batched_until_sent_now_or_due() {
    let (mut s, _prx, r, _brx) = pair(1 << 20, Timing::DEFAULT);
    // The sender thread parks first (until then it takes what it finds).
    std::thread::sleep(Duration::from_millis(50));
    s.write_all(b"frame-1").unwrap();
    std::thread::sleep(Duration::from_millis(50));
    // Nothing asked for it and nothing followed: it waits.
    assert_eq!(s.sent(), 0);
    s.send_now();
    let mut got = [0u8; 7];
    r.pipe().read_exact(&mut got).unwrap();
    assert_eq!(&got, b"frame-1");
    // Due after the delay: the next look sends it.
    s.write_all(b"frame-2").unwrap();
    std::thread::sleep(SEND_DELAY * 2);
    s.send_if_due();
    r.pipe().read_exact(&mut got).unwrap();
    assert_eq!(&got, b"frame-2");
    // A large batch goes by itself.
    s.write_all(&vec![7u8; SEND_BATCH as usize]).unwrap();
    let mut big = vec![0u8; SEND_BATCH as usize];
    r.pipe().read_exact(&mut big).unwrap();
}

#[test]
fn bytes_arrive_in_order_and_are_acknowledged_on_receipt() {
    let (mut s, prx, r, _brx) = pair(1 << 20, Timing::DEFAULT);
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
    s.write_all(&data).unwrap();
    // Acknowledged without the VM having read anything.
    assert!(s.wait_acked(data.len() as u64, Duration::from_secs(5)));
    assert!(matches!(prx.recv_timeout(Duration::from_secs(1)), Ok(PrimaryEvent::Acked)));
    let mut got = vec![0u8; data.len()];
    r.pipe().read_exact(&mut got).unwrap();
    assert_eq!(got, data);
    r.set_executed(12345);
    let t0 = Instant::now();
    while s.backup_icount() != 12345 {
        assert!(t0.elapsed() < Duration::from_secs(2), "execution progress never reported");
        std::thread::sleep(Duration::from_millis(5));
    }
    // The report's age is how long ago it came: after the count was set.
    let (icount, age) = s.backup_report();
    assert_eq!(icount, 12345);
    assert!(age <= t0.elapsed(), "{age:?}");
}

#[test]
fn delayed_acknowledgements_arrive_no_sooner_and_the_primary_waits_without_failing() {
    let (mut s, prx, r, _brx) = pair(1 << 20, Timing::DEFAULT);
    let delay = Duration::from_millis(700);
    r.delay_acks(delay);
    std::thread::sleep(Duration::from_millis(100));
    let t0 = Instant::now();
    s.write_all(b"entry").unwrap();
    assert!(s.wait_acked(5, Duration::from_secs(5)));
    let waited = t0.elapsed();
    assert!(waited >= delay && waited < delay * 2, "acknowledged after {waited:?}");
    // Longer than the timeout, yet no failure: the periodic
    // acknowledgements kept coming.
    assert!(delay > Timing::DEFAULT.timeout);
    assert!(s.failure().is_none());
    assert!(prx.try_iter().all(|e| matches!(e, PrimaryEvent::Acked)));
}

#[test]
fn a_backup_acknowledges_nothing_until_ready_and_can_refuse_with_its_reason() {
    let (s, prx, r) = header_sent_acks_held();
    // Alive (no failure for longer than the timeout), but nothing acknowledged.
    std::thread::sleep(Timing::DEFAULT.timeout * 2);
    assert_eq!(s.acked(), 0);
    assert!(s.failure().is_none());
    r.refuse("its disk differs");
    match prx.recv_timeout(Duration::from_secs(5)) {
        Ok(PrimaryEvent::BackupLost(Failure::Refused(why))) => assert_eq!(why, "its disk differs"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn requests_made_before_ready_arrive_ahead_of_the_first_acknowledgement() {
    for _ in 0..20 {
        let (s, _prx, r) = header_sent_acks_held();
        s.send_now();
        assert!(s.take_requests().is_empty());
        r.request(b"first".to_vec()).unwrap();
        r.request(vec![7u8; 100_000]).unwrap();
        assert!(r.request(vec![0u8; MAX_REQUEST + 1]).is_err());
        r.ready();
        assert!(s.wait_acked(6, Duration::from_secs(5)));
        assert_eq!(s.take_requests(), vec![b"first".to_vec(), vec![7u8; 100_000]]);
        assert!(s.take_requests().is_empty());
        assert!(s.failure().is_none());
    }
}

#[test]
fn full_buffers_stall_the_primary() {
    // 64 KiB at the backup, nobody consuming: the primary's own 64 KiB
    // buffer fills behind the socket buffers, and writes block. A stalled
    // channel is silent, so with the default timeout either side may
    // declare the other failed before a loaded host shows the stall (CI
    // saw it: the sender's writes then go nowhere, at memory speed); this
    // test is about flow control, so no failure comes within it.
    let timing = Timing { timeout: Duration::from_secs(120), min_timeout: Duration::from_secs(120), ..Timing::DEFAULT };
    let (addr, acc) = backup_on_loopback(64 << 10);
    let (stream, session) = connect(addr, Duration::from_secs(5), &key()).unwrap();
    let mut s = LogSender::over(stream, session, 64 << 10, timing, None, Fence::leased(), |_| {}).unwrap();
    let r = acc.join().unwrap();
    r.start(timing, |_| {}).unwrap();
    let written = Arc::new(AtomicU64::new(0));
    let w = written.clone();
    std::thread::spawn(move || {
        let chunk = vec![1u8; 4096];
        loop {
            s.write_all(&chunk).unwrap();
            w.fetch_add(4096, Ordering::Relaxed);
        }
    });
    // The writes stop once the buffers and the kernel's socket buffers
    // (which it may grow as data comes) are full: on a loaded host that
    // takes a while, so wait for them to stop rather than for a time.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut stalled_at = written.load(Ordering::Relaxed);
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now = written.load(Ordering::Relaxed);
        if now == stalled_at {
            break;
        }
        assert!(Instant::now() < deadline, "the primary never stalled ({now} bytes written)");
        stalled_at = now;
    }
    assert!(stalled_at < 32 << 20, "{stalled_at} bytes written before the primary stalled");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(written.load(Ordering::Relaxed), stalled_at, "the primary kept writing");
    // Consuming at the backup lets it go on.
    let mut pipe = r.pipe();
    let mut sink = vec![0u8; 1 << 20];
    for _ in 0..64 {
        let _ = pipe.read(&mut sink).unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(written.load(Ordering::Relaxed) > stalled_at);
}

#[test]
fn a_closed_primary_is_a_failure_and_the_log_drains() {
    let (mut s, _prx, r, brx) = pair(1 << 20, Timing::DEFAULT);
    s.write_all(b"last words").unwrap();
    assert!(s.wait_acked(10, Duration::from_secs(5)));
    drop(s);
    let f = brx.recv_timeout(Duration::from_secs(2)).expect("failure declared");
    assert!(matches!(f, Failure::Closed(_)), "{f:?}");
    r.end_log();
    let mut all = Vec::new();
    r.pipe().read_to_end(&mut all).unwrap();
    assert_eq!(all, b"last words");
}

#[test]
fn after_a_close_the_log_is_consumed_once_the_reader_has_read_it_all() {
    let (mut s, _prx, r, brx) = pair(1 << 20, Timing::DEFAULT);
    let r = Arc::new(r);
    s.write_all(b"0123456789").unwrap();
    assert!(s.wait_acked(10, Duration::from_secs(5)));
    drop(s);
    brx.recv_timeout(Duration::from_secs(2)).expect("failure declared");
    r.stop_receiving();
    let waiter = {
        let r = r.clone();
        std::thread::spawn(move || r.wait_consumed())
    };
    // Ten bytes are still to be read: whoever waits, waits.
    std::thread::sleep(Duration::from_millis(100));
    assert!(!waiter.is_finished());
    let mut pipe = r.pipe();
    let mut buf = [0u8; 10];
    pipe.read_exact(&mut buf).unwrap();
    // The reader now waits for more, which is what the waiter hears.
    let reader = std::thread::spawn(move || pipe.read(&mut [0u8; 1]).unwrap());
    assert!(waiter.join().unwrap(), "the reader is still reading");
    r.end_log();
    assert_eq!(reader.join().unwrap(), 0);
    // A reader that says it is done answers at once.
    r.reading_done();
    assert!(!r.wait_consumed());
}

#[test]
fn silence_is_a_failure_after_the_timeout() {
    let timing = Timing {
        timeout: Duration::from_millis(200),
        min_timeout: Duration::from_millis(200),
        interval: Duration::from_millis(20),
    };
    let (addr, acc) = backup_on_loopback(1 << 20);
    // A primary that completes the handshake and then sends nothing at
    // all, not even keep-alives (a link that stopped carrying its bytes).
    let (_stream, _session) = connect(addr, Duration::from_secs(5), &key()).unwrap();
    let r = acc.join().unwrap();
    let (btx, brx) = mpsc::channel();
    let btx = Mutex::new(btx);
    r.start(timing, move |f| {
        let _ = btx.lock().unwrap().send(f);
    })
    .unwrap();
    let t0 = Instant::now();
    let f = brx.recv_timeout(Duration::from_secs(3)).expect("failure declared");
    assert!(matches!(f, Failure::ChannelSilent(_)), "{f:?}");
    assert!(t0.elapsed() >= Duration::from_millis(150));
    assert!(r.failure().is_some());
}

#[test]
fn a_primary_with_no_log_to_send_keeps_its_channel_alive() {
    // The VM's side writes nothing for three timeouts (a checkpoint being
    // compressed, a starved VM thread): the channel's own sender thread
    // keeps the backup hearing from it, and the log goes on in order.
    let timing = Timing {
        timeout: Duration::from_millis(200),
        min_timeout: Duration::from_millis(200),
        interval: Duration::from_millis(20),
    };
    let (mut s, prx, r, brx) = pair(1 << 20, timing);
    s.write_all(b"before").unwrap();
    s.send_now();
    std::thread::sleep(timing.timeout * 3);
    assert!(brx.try_recv().is_err(), "the backup declared a silent-but-alive primary failed");
    if let Some(e) = prx.try_iter().find(|e| matches!(e, PrimaryEvent::BackupLost(_))) {
        panic!("the primary declared its backup failed: {e:?}");
    }
    s.write_all(b" after").unwrap();
    s.send_now();
    let mut got = vec![0u8; 12];
    r.pipe().read_exact(&mut got).unwrap();
    assert_eq!(&got, b"before after");
}

/// Issue 65: a backup whose replay is far behind (a loaded host at boot)
/// takes no log for several timeouts while its primary writes on. The
/// channel is stalled by the backup, not silent by the primary: neither
/// side declares the other failed, and the log goes on, whole and in
/// order, once the replay reads again. The old receiving thread waited in
/// the full pipe with a frame that did not fit, and the backup took the
/// stall for its primary's silence.
#[test]
fn a_backup_far_behind_does_not_take_its_own_stall_for_the_primarys_silence() {
    let timing = Timing {
        timeout: Duration::from_millis(200),
        min_timeout: Duration::from_millis(200),
        interval: Duration::from_millis(20),
    };
    let (mut s, prx, r, brx) = pair(64 << 10, timing);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // Odd sizes, so frames straddle the pipe's last room.
                let chunk: Vec<u8> = (0..3001u64).map(|i| ((n * 3001 + i) % 251) as u8).collect();
                s.write_all(&chunk).unwrap();
                n += 1;
            }
            s
        })
    };
    std::thread::sleep(timing.timeout * 6);
    assert!(brx.try_recv().is_err(), "the backup declared a primary it was not reading failed");
    if let Some(e) = prx.try_iter().find(|e| matches!(e, PrimaryEvent::BackupLost(_))) {
        panic!("the primary declared its slow backup failed: {e:?}");
    }
    // The replay reads again: the log is whole and in order.
    let mut pipe = r.pipe();
    let mut got = vec![0u8; 1 << 20];
    pipe.read_exact(&mut got).unwrap();
    stop.store(true, Ordering::Relaxed);
    for (i, b) in got.iter().enumerate() {
        assert_eq!(*b, (i % 251) as u8, "byte {i}");
    }
    assert!(brx.try_recv().is_err());
    drop(writer);
}

#[test]
fn a_silent_backup_is_a_failure_for_the_primary() {
    let timing = Timing {
        timeout: Duration::from_millis(200),
        min_timeout: Duration::from_millis(200),
        interval: Duration::from_millis(20),
    };
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    // Accepts, completes the handshake, and never acknowledges.
    let _held = std::thread::spawn(move || {
        let (mut c, _) = listener.accept().unwrap();
        let _session = secure::respond(&mut c, &key(), Duration::from_secs(5)).unwrap();
        std::thread::sleep(Duration::from_secs(3));
        drop(c);
    });
    let (_s, rx) = primary_to(addr, timing);
    match rx.recv_timeout(Duration::from_secs(2)).unwrap() {
        PrimaryEvent::BackupLost(Failure::ChannelSilent(_)) => {}
        other => panic!("{other:?}"),
    }
}

/// What a stranger on the network can do to a waiting backup: connect and
/// say nothing, send garbage, or try the handshake with another key. The
/// backup refuses each (the idle one when its time is up), keeps
/// listening, and takes its real primary when it comes, beside the idle
/// connection's pending handshake.
#[test]
fn strangers_do_not_stop_a_backup_from_taking_its_primary() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let refused = Arc::new(Mutex::new(Vec::new()));
    let acc = {
        let refused = refused.clone();
        std::thread::spawn(move || {
            LogReceiver::accept(&listener, 1 << 20, &key(), move |peer, e| {
                refused.lock().unwrap().push((peer, e.to_string()));
            })
            .unwrap()
        })
    };
    let _idle = TcpStream::connect(addr).unwrap();
    let mut garbage = TcpStream::connect(addr).unwrap();
    garbage.write_all(&[0xff; 4096]).unwrap();
    garbage.shutdown(std::net::Shutdown::Write).unwrap();
    let stranger = connect(addr, Duration::from_secs(5), &PairKey::from_bytes([1; 32]));
    assert!(matches!(stranger, Err(ChannelError::Handshake { .. })), "{:?}", stranger.err());
    let (mut s, _prx) = primary_to(addr, Timing::DEFAULT);
    let r = acc.join().unwrap();
    r.start(Timing::DEFAULT, |_| {}).unwrap();
    s.write_all(b"the real log").unwrap();
    s.send_now();
    let mut got = [0u8; 12];
    r.pipe().read_exact(&mut got).unwrap();
    assert_eq!(&got, b"the real log");
    let t0 = Instant::now();
    while refused.lock().unwrap().len() < 2 && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let refused = refused.lock().unwrap();
    assert!(refused.len() >= 2, "the garbage and the wrong key: {refused:?}");
    assert!(refused.iter().any(|(_, e)| e.contains("does not hold this pair's key")), "{refused:?}");
}

/// Issue 68: the first handshake message of a real primary, recorded and
/// sent again to a backup waiting for a later primary of the pair, is a
/// stranger's: refused (the replayer who goes at once, and the one who
/// stays silent), never taken for the primary, and the backup follows its
/// real primary when it comes.
#[test]
fn a_recorded_handshake_is_refused_and_the_real_primary_followed() {
    // Recorded through a relay in front of a first backup.
    let (addr, acc) = backup_on_loopback(1 << 20);
    let front = TcpListener::bind("127.0.0.1:0").unwrap();
    let front_addr = front.local_addr().unwrap();
    let recorded = std::thread::spawn(move || {
        let (mut a, _) = front.accept().unwrap();
        let mut b = TcpStream::connect(addr).unwrap();
        let mut first = [0u8; 50];
        a.read_exact(&mut first).unwrap();
        b.write_all(&first).unwrap();
        let (mut a2, mut b2) = (a.try_clone().unwrap(), b.try_clone().unwrap());
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut b2, &mut a2);
        });
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut a, &mut b);
        });
        first
    });
    let (mut s, _prx) = primary_to(front_addr, Timing::DEFAULT);
    let r = acc.join().unwrap();
    r.start(Timing::DEFAULT, |_| {}).unwrap();
    s.write_all(b"first pair").unwrap();
    s.send_now();
    let mut got = [0u8; 10];
    r.pipe().read_exact(&mut got).unwrap();
    let first = recorded.join().unwrap();
    assert_eq!(u16::from_be_bytes([first[0], first[1]]), 48, "one whole first message recorded");
    drop((s, r));

    // A later backup of the pair, and the replays.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let refused = Arc::new(Mutex::new(Vec::new()));
    let (won_tx, won) = mpsc::channel();
    {
        let refused = refused.clone();
        std::thread::spawn(move || {
            let r = LogReceiver::accept(&listener, 1 << 20, &key(), move |peer, e| {
                refused.lock().unwrap().push((peer, e.to_string()));
            });
            let _ = won_tx.send(r.unwrap());
        });
    }
    let mut silent = TcpStream::connect(addr).unwrap();
    silent.write_all(&first).unwrap();
    for _ in 0..3 {
        let mut gone = TcpStream::connect(addr).unwrap();
        gone.write_all(&first).unwrap();
        let mut answer = [0u8; 50];
        gone.read_exact(&mut answer).unwrap();
        drop(gone);
    }
    let t0 = Instant::now();
    while refused.lock().unwrap().len() < 3 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    if let Ok(r) = won.try_recv() {
        panic!("a replay was taken for the primary: {}", r.peer());
    }
    {
        let refused = refused.lock().unwrap();
        assert_eq!(refused.len(), 3, "{refused:?}");
        assert!(refused.iter().all(|(_, e)| e.contains("did not confirm")), "{refused:?}");
    }
    let (mut s, _prx) = primary_to(addr, Timing::DEFAULT);
    let r = won.recv_timeout(Duration::from_secs(10)).expect("the real primary is taken");
    r.start(Timing::DEFAULT, |_| {}).unwrap();
    s.write_all(b"second pair").unwrap();
    s.send_now();
    let mut got = [0u8; 11];
    r.pipe().read_exact(&mut got).unwrap();
    assert_eq!(&got, b"second pair");
    drop(silent);
}

/// A TCP connection to `to` from the loopback address `from` (127.0.0.x:
/// another host, as the backup sees it).
fn connect_from(from: std::net::Ipv4Addr, to: SocketAddr) -> TcpStream {
    use std::os::fd::FromRawFd;
    let sin = |ip: std::net::Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(ip).to_be() },
        sin_zero: [0; 8],
    };
    let SocketAddr::V4(to) = to else { panic!("IPv4") };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a fresh socket, and addresses valid for each call; the
    // descriptor goes to the TcpStream, which closes it.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0);
        let (a, b) = (sin(from, 0), sin(*to.ip(), to.port()));
        assert_eq!(libc::bind(fd, (&a as *const libc::sockaddr_in).cast(), len), 0, "bind {from}");
        assert_eq!(libc::connect(fd, (&b as *const libc::sockaddr_in).cast(), len), 0, "connect from {from}");
        TcpStream::from_raw_fd(fd)
    }
}

/// Issue 68: idle connections cannot hold the handshake slots. 40 from
/// 40 addresses and 20 from the primary's own, all silent and kept open,
/// then the real primary: it is taken, at once (not after the silent
/// ones' deadline), and the flood is refused or closed.
#[test]
fn idle_strangers_do_not_keep_the_primary_out() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let refused = Arc::new(Mutex::new(Vec::new()));
    let acc = {
        let refused = refused.clone();
        std::thread::spawn(move || {
            LogReceiver::accept(&listener, 1 << 20, &key(), move |peer, e| {
                refused.lock().unwrap().push((peer, e.to_string()));
            })
            .unwrap()
        })
    };
    let mut idle: Vec<TcpStream> = (2..42).map(|i| connect_from([127, 0, 0, i].into(), addr)).collect();
    idle.extend((0..20).map(|_| TcpStream::connect(addr).unwrap()));
    // Until the backup has taken them all from its queue.
    let t0 = Instant::now();
    while refused.lock().unwrap().len() < 16 && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let t0 = Instant::now();
    let (mut s, _prx) = primary_to(addr, Timing::DEFAULT);
    let r = acc.join().unwrap();
    let took = t0.elapsed();
    r.start(Timing::DEFAULT, |_| {}).unwrap();
    s.write_all(b"through").unwrap();
    s.send_now();
    let mut got = [0u8; 7];
    r.pipe().read_exact(&mut got).unwrap();
    assert_eq!(&got, b"through");
    // Well inside the silent ones' first-byte deadline: the primary did
    // not wait for them to go.
    assert!(took < receiver::FIRST_BYTE_WAIT, "the primary waited {took:?}");
    let refused = refused.lock().unwrap();
    let of = |what: &str| refused.iter().filter(|(_, e)| e.contains(what)).count();
    println!("refused: {} busy, {} closed while silent, of {}", of("too many"), of("room"), refused.len());
    assert!(of("too many") + of("room") >= 16, "{refused:?}");
    drop(idle);
}

/// A connection that says nothing is closed after the first-byte
/// deadline, not the whole handshake's.
#[test]
fn a_silent_connection_is_closed_at_the_first_byte_deadline() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let refused = Arc::new(Mutex::new(Vec::new()));
    {
        let refused = refused.clone();
        std::thread::spawn(move || {
            let _ = LogReceiver::accept(&listener, 1 << 20, &key(), move |_, e| {
                refused.lock().unwrap().push((Instant::now(), e.to_string()));
            });
        });
    }
    let t0 = Instant::now();
    let mut silent = TcpStream::connect(addr).unwrap();
    silent.set_read_timeout(Some(HANDSHAKE_WAIT * 2)).unwrap();
    let mut buf = [0u8; 1];
    // Closed by the backup: the end of the stream.
    assert_eq!(silent.read(&mut buf).unwrap(), 0);
    let took = t0.elapsed();
    assert!(took >= receiver::FIRST_BYTE_WAIT && took < HANDSHAKE_WAIT, "closed after {took:?}");
    let refused = refused.lock().unwrap();
    assert!(refused.iter().any(|(_, e)| e.contains("no handshake within")), "{refused:?}");
}

/// Bytes changed on the wire after the handshake (a man in the middle
/// without the key) are a failure, not data.
#[test]
fn tampered_log_is_a_failure_not_data() {
    let front = TcpListener::bind("127.0.0.1:0").unwrap();
    let (addr, acc) = backup_on_loopback(1 << 20);
    let front_addr = front.local_addr().unwrap();
    // A relay that flips one bit of everything after the first 200 bytes:
    // the handshake (the primary sends 105) goes through, the log does not.
    std::thread::spawn(move || {
        let (mut a, _) = front.accept().unwrap();
        let mut b = TcpStream::connect(addr).unwrap();
        let (mut a2, mut b2) = (a.try_clone().unwrap(), b.try_clone().unwrap());
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut b2, &mut a2);
        });
        let mut buf = [0u8; 4096];
        let mut seen = 0usize;
        loop {
            let n = match a.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            for (i, byte) in buf[..n].iter_mut().enumerate() {
                if seen + i >= 200 {
                    *byte ^= 0x01;
                }
            }
            seen += n;
            if b.write_all(&buf[..n]).is_err() {
                return;
            }
        }
    });
    let (mut s, _prx) = primary_to(front_addr, Timing::DEFAULT);
    let r = acc.join().unwrap();
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    r.start(Timing::DEFAULT, move |f| {
        let _ = tx.lock().unwrap().send(f);
    })
    .unwrap();
    s.write_all(&[7u8; 1000]).unwrap();
    s.send_now();
    let f = rx.recv_timeout(Duration::from_secs(5)).expect("a failure");
    assert_eq!(f, Failure::Unauthentic);
    assert_eq!(r.received(), 0, "nothing tampered with reached the log");
}

/// The primary's lease follows the backup's acknowledgements: none
/// before the first, renewed by each, and run out a timeout (less the
/// allowances) after the last, whatever the primary does meanwhile.
#[test]
fn acknowledgements_renew_the_primarys_lease_and_it_runs_out_without_them() {
    let timing = Timing {
        timeout: Duration::from_millis(400),
        min_timeout: Duration::from_millis(400),
        interval: Duration::from_millis(20),
    };
    let (mut s, _prx, r, _brx) = pair(1 << 20, timing);
    let fence = s.fence();
    assert!(!fence.allows(), "a lease before any acknowledgement");
    s.write_all(b"some log").unwrap();
    assert!(s.wait_acked(8, Duration::from_secs(5)));
    // The acknowledgement renews the lease on the reader thread.
    within_5s("the acknowledgement did not renew the lease", || fence.allows());
    // The backup stops acknowledging log (as one that stopped would).
    r.hold_acks();
    let held = Instant::now();
    within_5s("the lease never ran out", || !fence.allows());
    assert!(held.elapsed() <= timing.timeout, "ran {:?}, longer than the timeout", held.elapsed());
}

/// Waits (polling) until `done`, failing the test with `what` after 5 s.
fn within_5s(what: &str, done: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !done() {
        assert!(t0.elapsed() < Duration::from_secs(5), "{what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The lease never outruns the backup's timeout: a primary started with
/// a far longer one than its backup's (two hosts given different
/// options, or a shorter timeout the primary sent not yet taken) holds
/// its lease only as long as the backup waits before it may go live.
/// The backup's acknowledgements say its timeout, and a change it takes
/// shows in the next one.
#[test]
fn the_lease_runs_no_longer_than_the_backups_timeout() {
    let long = Timing::with_timeout(Duration::from_secs(4));
    let short = Timing {
        timeout: Duration::from_millis(300),
        min_timeout: Duration::from_millis(300),
        interval: Duration::from_millis(20),
    };
    let (addr, acc) = backup_on_loopback(1 << 20);
    let (mut s, _prx) = primary_to(addr, long);
    let r = acc.join().unwrap();
    r.start(short, |_| {}).unwrap();
    let fence = s.fence();
    s.write_all(b"some log").unwrap();
    assert!(s.wait_acked(8, Duration::from_secs(5)));
    within_5s("the acknowledgement did not renew the lease", || fence.allows());
    assert_eq!(s.watch().backup_timeout(), Some(short.timeout));
    r.hold_acks();
    let held = Instant::now();
    within_5s("the lease never ran out", || !fence.allows());
    assert!(held.elapsed() <= short.timeout, "ran {:?}, longer than the backup's timeout", held.elapsed());
    // A longer timeout the backup takes is in its next acknowledgement.
    r.follow_timeout(Duration::from_millis(900));
    within_5s("the new timeout was never acknowledged", || {
        s.watch().backup_timeout() == Some(Duration::from_millis(900))
    });
}

/// Two heartbeats beating at each other on fresh loopback ports, each
/// `(local, peer)`: the primary's and the backup's.
fn beating(timing: Timing) -> (crate::heartbeat::Heartbeat, crate::heartbeat::Heartbeat) {
    use crate::heartbeat::Heartbeat;
    let free = || std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let (p, b) = (free(), free());
    (Heartbeat::start(p, b, 1, timing, &key()).unwrap(), Heartbeat::start(b, p, 1, timing, &key()).unwrap())
}

/// Waits (up to 30 s: a loaded host's late beats are learned too) until
/// `timeout()` is below the ceiling: a timeout was learned from the beats.
fn learned(timing: Timing, timeout: impl Fn() -> Duration) -> Duration {
    let t0 = Instant::now();
    loop {
        let t = timeout();
        if t < timing.timeout {
            return t;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "nothing learned from the beats: still {t:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The backup learns a heartbeat timeout shorter than the channel's from
/// the primary's beats, tells it in its acknowledgements, and the
/// primary's lease runs no longer than it: a backup that stops
/// acknowledging leaves the primary releasing nothing within the learned
/// timeout, not the channel's 500 ms.
#[test]
fn the_lease_runs_no_longer_than_the_learned_heartbeat_timeout() {
    let timing = Timing::new(Duration::from_millis(500), Duration::from_millis(60));
    let (primary_beat, backup_beat) = beating(timing);
    let (addr, acc) = backup_on_loopback(1 << 20);
    let (stream, session) = connect(addr, Duration::from_secs(5), &key()).unwrap();
    let mut s =
        LogSender::over(stream, session, DEFAULT_BUFFER, timing, Some(primary_beat), Fence::leased(), |_| {}).unwrap();
    let r = acc.join().unwrap();
    r.add_heartbeat(backup_beat);
    r.start(timing, |_| {}).unwrap();
    let watch = s.watch();
    let told = learned(timing, || watch.backup_heartbeat_timeout().unwrap_or(timing.timeout));
    assert!(told >= timing.min_timeout, "{told:?} below the floor");
    assert!(learned(timing, || watch.heartbeat_timeout()) >= timing.min_timeout, "the primary learns too");
    let fence = s.fence();
    s.write_all(b"some log").unwrap();
    assert!(s.wait_acked(8, Duration::from_secs(5)));
    within_5s("the acknowledgement did not renew the lease", || fence.allows());
    let told = watch.backup_heartbeat_timeout().unwrap();
    r.hold_acks();
    let held = Instant::now();
    within_5s("the lease never ran out", || !fence.allows());
    assert!(held.elapsed() <= told, "ran {:?}, longer than the {told:?} the backup told", held.elapsed());
}

/// A primary whose beats stop while its channel still carries keep-alives
/// (as a crashed host's would not, but its beats are what the backup
/// judges first) is declared failed after the learned heartbeat timeout,
/// well within the channel's.
#[test]
fn silent_beats_are_a_failure_after_the_learned_timeout() {
    let timing = Timing::new(Duration::from_millis(500), Duration::from_millis(60));
    let (primary_beat, backup_beat) = beating(timing);
    let (_s, _prx, r, brx) = pair(1 << 20, timing);
    r.add_heartbeat(backup_beat);
    let learned = learned(timing, || r.heartbeat_timeout());
    drop(primary_beat);
    let stopped = Instant::now();
    let f = brx.recv_timeout(Duration::from_secs(5)).expect("declared");
    let after = stopped.elapsed();
    assert!(matches!(f, Failure::HeartbeatSilent(_)), "{f:?}");
    assert!(after < timing.timeout, "declared {after:?} after the beats stopped (learned {learned:?})");
}

/// A backup that refuses says why and closes the channel; a primary
/// writing on finds it closed (a broken pipe) perhaps before its reader
/// has read why. The refusal is still the failure it reports: the test
/// of anti-affinity saw "the logging channel closed (Broken pipe)".
#[test]
fn a_refusal_is_the_failure_even_when_a_write_finds_the_channel_closed_first() {
    for round in 0..10 {
        let (mut s, _prx, r) = header_sent_acks_held();
        let refusing = std::thread::spawn(move || r.refuse("not on this host"));
        let chunk = vec![7u8; 256 << 10];
        let mut written = 6u64;
        let t0 = Instant::now();
        while s.failure().is_none() && t0.elapsed() < Duration::from_secs(20) {
            if s.write_all(&chunk).is_ok() {
                written += chunk.len() as u64;
            }
            s.wait_acked(written, Duration::from_millis(1));
        }
        refusing.join().unwrap();
        match s.failure() {
            Some(Failure::Refused(why)) => assert_eq!(why, "not on this host"),
            other => panic!("round {round}: {other:?}"),
        }
    }
}
