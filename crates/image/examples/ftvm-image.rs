//! Stand-alone driver for the ftvm-image library (until/besides `ftvm image`):
//!
//! ```text
//! cargo run --release -p ftvm-image --example ftvm-image -- build [--force] [--mirror URL] [--quiet]
//! cargo run --release -p ftvm-image --example ftvm-image -- path      # KEY=VALUE lines (shell-sourceable)
//! cargo run --release -p ftvm-image --example ftvm-image -- info      # stamp: kernel, packages
//! cargo run --release -p ftvm-image --example ftvm-image -- cmdline [--exec CMD] [--ip ADDR/PREFIX[,GW]]
//! ```
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| args.iter().any(|a| a == name);
    let value = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let result = match args.first().map(String::as_str) {
        Some("build") => {
            let progress: Option<ftvm_image::Reporter> = (!flag("--quiet")).then(|| {
                std::sync::Arc::new(|p: ftvm_image::Progress<'_>| match p {
                    ftvm_image::Progress::Step { number, of, what } => eprintln!("ftvm-image: [{number}/{of}] {what}"),
                    ftvm_image::Progress::Note(n) => eprintln!("ftvm-image: {n}"),
                    ftvm_image::Progress::Bytes(_) => {}
                }) as ftvm_image::Reporter
            });
            let opts = ftvm_image::BuildOptions {
                force: flag("--force"),
                mirror: value("--mirror"),
                progress,
                ..Default::default()
            };
            ftvm_image::build(&opts).map(|img| print_paths(&img))
        }
        Some("path") => ftvm_image::locate().map(|img| print_paths(&img)),
        Some("info") => ftvm_image::stamp().map(|st| {
            println!(
                "kernel_version={}\ninitrd_compression={}\nbuild_seconds={:.1}",
                st.kernel_version, st.initrd_compression, st.build_seconds
            );
            println!("initrd_modules={}", st.initrd_modules.join(","));
            for (p, v) in st.packages {
                println!("package {p} {v}");
            }
        }),
        Some("cmdline") => ftvm_image::kernel_cmdline(value("--exec").as_deref(), value("--ip").as_deref(), "")
            .map(|l| println!("{l}")),
        _ => {
            eprintln!("usage: ftvm-image build [--force] [--mirror URL] [--quiet] | path | info | cmdline [--exec CMD] [--ip IP]");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn print_paths(img: &ftvm_image::GuestImage) {
    println!("FTVM_KERNEL={}", img.kernel.display());
    println!("FTVM_INITRD={}", img.initrd.display());
    println!("FTVM_ROOTFS={}", img.rootfs.display());
    println!("FTVM_FIRMWARE={}", img.firmware.display());
    println!("FTVM_KERNEL_VERSION={}", img.kernel_version);
}
