//! The guest boot an image build needs (`ftvm_image::GuestRunner`): the
//! packages' configuration runs in the image itself, on ftvm, as
//! `ftvm run --exec` of this same program would run it.
//!
//! A child process of our own program rather than the VM in this one: the
//! run owns the process's standard streams (its command's output is its
//! stdout) and its signals, and ends with its status, which is what a
//! build waits for; the child is killed if the build is.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use ftvm_image::{GuestBoot, GuestRunner};

/// Runs a build's guest boot as a child `ftvm run --exec`.
pub struct ChildRun;

/// Memory for the configuration (apt and dpkg on a few hundred packages
/// take about 200 MiB; a package's own setup, initdb say, more).
const MEM: &str = "1G";

impl GuestRunner for ChildRun {
    fn run(&self, boot: &GuestBoot<'_>, line: &mut dyn FnMut(&str)) -> Result<i32, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
        let mut child = Command::new(exe)
            .arg("run")
            .arg("--bios")
            .arg(boot.firmware)
            .arg("--kernel")
            .arg(boot.kernel)
            .arg("--initrd")
            .arg(boot.initrd)
            .arg("--disk")
            .arg(boot.disk)
            .args(["--mem", MEM, "--no-rng", "--fast-time", "--log-level", "error"])
            .arg("--append")
            .arg(boot.cmdline)
            .arg("--exec")
            .arg(boot.command)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start the guest: {e}"))?;
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let readers: Vec<_> = [
            Box::new(child.stdout.take().expect("piped")) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().expect("piped")),
        ]
        .into_iter()
        .map(|pipe| {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for l in BufReader::new(pipe).lines().map_while(Result::ok) {
                    let _ = tx.send(l);
                }
            })
        })
        .collect();
        drop(tx);
        for l in rx {
            line(&l);
        }
        for r in readers {
            let _ = r.join();
        }
        let status = child.wait().map_err(|e| format!("waiting for the guest: {e}"))?;
        status.code().ok_or_else(|| format!("the guest's run ended by {status}"))
    }
}
