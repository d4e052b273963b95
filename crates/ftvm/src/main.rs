//! `ftvm`: run, record, replay and protect a RISC-V virtual machine.
//!
//! This program is argument parsing and nothing else: what it runs is the
//! host library `ftvm_vmm`, which another front end (a daemon, a test) can
//! drive in-process as well.

use clap::{Args, CommandFactory, Parser, Subcommand};
use ftvm_api::VmConfig;
use ftvm_vmm::api::{Request, Response};
use ftvm_vmm::launch::Target;
use ftvm_vmm::{control, ft, launch, replay};
use run_cli::{RecordArgs, ReplayArgs, RunArgs};
use std::path::PathBuf;
use std::process::ExitCode;

mod cluster_cli;
mod console_cli;
mod image_runner;
mod pair_cli;
mod progress;
mod run_cli;

/// `ftvm --version`: the version and the git commit built from (see build.rs).
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("FTVM_GIT_COMMIT"), ")");

#[derive(Parser)]
#[command(name = "ftvm", version = VERSION, about = "Fault-tolerant virtual machines")]
struct Cli {
    /// Diagnostics on stderr: error, warn (the default), info, debug,
    /// trace, off, or a tracing filter such as `ftvm_vmm=debug` (as
    /// RUST_LOG, which this overrides).
    #[arg(long, global = true, value_name = "LEVEL")]
    log_level: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Boot a virtual machine (the default Debian guest unless told otherwise).
    Run(Box<RunArgs>),
    /// Run a VM as `run` does and write every input it receives to a replay log.
    Record(Box<RecordArgs>),
    /// Re-execute a recorded VM from its log, with no host I/O.
    Replay(ReplayArgs),
    /// Fault tolerance: a primary VM and its backup on another host (lockstep, epoch or checkpoint mode).
    #[command(subcommand)]
    Ft(FtCommand),
    /// Build, list, locate or remove guest images.
    #[command(subcommand)]
    Image(ImageCommand),
    /// The daemon of one host of a cluster: runs its VMs, records the host
    /// in etcd, serves the HTTP API and metrics.
    Agent(Box<cluster_cli::AgentArgs>),
    /// The cluster's hosts and VMs, through etcd and the agents' API.
    Cluster(Box<cluster_cli::ClusterArgs>),
    /// The VMs on this host that have a control socket (`--control`), with
    /// their sockets, roles (alone, primary, backup, unprotected) and states.
    List {
        /// One JSON object a line instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print a shell completion script (e.g. `ftvm completions bash >
    /// /etc/bash_completion.d/ftvm`).
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (ftvm.1), or write one for every command to DIR.
    Man {
        /// Write ftvm.1, ftvm-run.1, ... into this directory instead.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Attach this terminal to a running VM's serial console through its
    /// control socket: its recent output first, then what it shows; what
    /// you type goes to the VM (one client types at a time, any number
    /// watch). Ctrl-] detaches.
    Console {
        /// Watch only: nothing typed here reaches the VM.
        #[arg(long)]
        read_only: bool,
        /// The socket given to `ftvm run --control` (or `ft primary`'s,
        /// or a backup's once it went live).
        socket: PathBuf,
    },
    /// Send a command to a running VM's control socket: status, pause,
    /// resume, snapshot FILE, quit, handover, protect --backup HOST:PORT
    /// --shared DIR [...] (give the running VM a backup; `protect --help`),
    /// unprotect, timeout MS, cpu-limit PERCENT, events (its events so far
    /// and as they come, until it ends).
    Control {
        /// Print the VM's answer as the JSON line it came in.
        #[arg(long)]
        json: bool,
        /// Seconds to wait for the VM's answer (a snapshot of a large VM
        /// takes a while).
        #[arg(long, value_name = "SECONDS", default_value_t = 120)]
        timeout: u64,
        /// The socket given to `ftvm run --control`.
        socket: PathBuf,
        /// The command and its argument.
        #[arg(required = true, num_args = 1.., trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
}

#[derive(Subcommand)]
enum FtCommand {
    /// Run a VM protected by a backup on another host (run options apply).
    Primary(Box<FtPrimaryArgs>),
    /// Keep the replica of a primary's VM, ready to take over.
    Backup(Box<pair_cli::BackupArgs>),
    /// Write a new random pair key to FILE (mode 0600), for --pair-key on
    /// both hosts; it never replaces an existing file.
    Keygen {
        /// Where to write it.
        file: PathBuf,
    },
}

#[derive(Args)]
pub struct FtPrimaryArgs {
    #[command(flatten)]
    ft: pair_cli::PrimaryArgs,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand)]
enum ImageCommand {
    /// Build the default guest, or a named one with more software, from
    /// Debian trixie riscv64 packages (cached: an image built as asked is
    /// not built again).
    Build(ImageBuildArgs),
    /// Print the directory holding an image (the default one unless NAME).
    Path {
        /// An image's name, as `ftvm image list` shows it.
        name: Option<String>,
    },
    /// The images built: name, space on disk, extra packages.
    List,
    /// Remove an image (refused while a VM writes it with --persist).
    Rm {
        /// An image's name, as `ftvm image list` shows it.
        name: String,
    },
}

#[derive(Args)]
struct ImageBuildArgs {
    /// Rebuild even if a cached image exists.
    #[arg(long)]
    force: bool,
    /// Debian packages to add to the default ones (busybox, redis,
    /// iperf3), comma-separated or repeated; apt resolves their
    /// dependencies and versions. They are extracted, not configured: no
    /// maintainer scripts run.
    #[arg(long, value_name = "PKG,...")]
    packages: Vec<String>,
    /// Size of the image's root disk (sparse), e.g. 4G. Default 1G.
    #[arg(long)]
    size: Option<String>,
    /// The image's name (`ftvm run --image NAME`). Default: the packages'
    /// names joined with `-`, or the default image without packages.
    #[arg(long)]
    name: Option<String>,
    /// A directory (its contents) or a tar archive of your own files, put
    /// into the root at PATH, owned by root. May be repeated.
    #[arg(long = "add", value_name = "SOURCE:/PATH")]
    adds: Vec<String>,
    /// A public key (an OpenSSH `.pub` file) root may log in with over
    /// ssh (the image needs openssh-server). May be repeated.
    #[arg(long = "ssh-key", value_name = "FILE")]
    ssh_keys: Vec<std::path::PathBuf>,
    /// Show no progress (only the image's directory at the end).
    #[arg(long)]
    quiet: bool,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                print!("{e}");
                return ExitCode::SUCCESS;
            }
            let msg = e.to_string();
            if matches!(e.kind(), ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand | ErrorKind::MissingSubcommand) {
                // clap's message here is the whole help text; its first line
                // would be the program's description, not an error.
                let usage = msg.lines().find_map(|l| l.trim().strip_prefix("Usage: ")).unwrap_or("ftvm <COMMAND>");
                let prefix: Vec<&str> =
                    usage.split_whitespace().take_while(|w| !w.starts_with('<') && !w.starts_with('[')).collect();
                eprintln!("ftvm: missing command (usage: {usage}; see `{} --help`)", prefix.join(" "));
                return ExitCode::from(2);
            }
            let mut lines = msg.lines();
            let mut first = lines.next().unwrap_or("invalid arguments").trim_start_matches("error: ").to_string();
            // "...were not provided:" lists the arguments on the lines after.
            if first.ends_with(':') {
                let rest: Vec<&str> =
                    lines.map(str::trim).take_while(|l| !l.is_empty() && !l.starts_with("Usage")).collect();
                first = format!("{} {}", first, rest.join(", "));
            }
            eprintln!("ftvm: {first}");
            return ExitCode::from(2);
        }
    };
    if let Err(msg) = init_logging(cli.log_level.as_deref()) {
        eprintln!("ftvm: {msg}");
        return ExitCode::from(2);
    }
    // Each library's typed error, printed here as its one-line message.
    let result: Result<u32, Box<dyn std::error::Error>> = match cli.command {
        Command::Run(args) => run(*args, Target::None),
        Command::Record(r) => run(r.run, Target::File(r.log)),
        Command::Ft(FtCommand::Primary(p)) => run(p.run, Target::Backup(p.ft.into())),
        Command::Ft(FtCommand::Backup(b)) => match ftvm_api::BackupConfig::try_from(*b) {
            Ok(config) => ft::backup::run(&config).map_err(Into::into),
            Err(e) => Err(e.into()),
        },
        Command::Ft(FtCommand::Keygen { file }) => ftvm_replication::pair_key::PairKey::create(&file)
            .map(|key| {
                println!("{} (key {})", file.display(), key.id());
                0
            })
            .map_err(Into::into),
        Command::Replay(r) => replay::replay(&r.into()).map_err(Into::into),
        Command::Agent(a) => cluster_cli::agent(*a),
        Command::Cluster(c) => cluster_cli::cluster(*c),
        Command::Image(ImageCommand::Build(args)) => image_build(&args),
        Command::Image(ImageCommand::List) => image_list(),
        Command::Image(ImageCommand::Rm { name }) => ftvm_image::remove(&name)
            .map(|dir| {
                println!("removed {}", dir.display());
                0
            })
            .map_err(Into::into),
        Command::Control { json, timeout, socket, command } => {
            control_command(&socket, &command.join(" "), json, std::time::Duration::from_secs(timeout))
        }
        Command::Console { read_only, socket } => console_cli::console(&socket, read_only),
        Command::List { json } => list(json),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "ftvm", &mut std::io::stdout());
            Ok(0)
        }
        Command::Man { dir } => man(dir.as_deref()),
        Command::Image(ImageCommand::Path { name }) => name
            .as_deref()
            .map_or_else(ftvm_image::locate, ftvm_image::locate_named)
            .map(|img| {
                println!("{}", img.kernel.parent().unwrap_or(&img.kernel).display());
                0
            })
            .map_err(Into::into),
    };
    match result {
        Ok(code) => ExitCode::from(code.min(255) as u8),
        Err(msg) => {
            eprintln!("ftvm: {msg}");
            ExitCode::from(msg.downcast_ref::<ftvm_vmm::error::VmmError>().map_or(1, |e| e.exit_code()))
        }
    }
}

/// `ftvm run`, `record` and `ft primary`: the VM's options, turned into its
/// configuration, run as `target` says.
fn run(args: RunArgs, target: Target) -> Result<u32, Box<dyn std::error::Error>> {
    let config = VmConfig::try_from(args)?;
    launch::run(config, target).map_err(Into::into)
}

/// `ftvm control`: one request, its answer on stdout (readable, or the
/// JSON line with `--json`); a refusal is also the exit status.
fn control_command(
    socket: &std::path::Path,
    words: &str,
    json: bool,
    wait: std::time::Duration,
) -> Result<u32, Box<dyn std::error::Error>> {
    let mut request = match words.split_whitespace().collect::<Vec<_>>().as_slice() {
        // `protect`'s options are `ftvm ft primary`'s: their help is clap's.
        ["protect", rest @ ..] if rest.iter().any(|w| matches!(*w, "--help" | "-h")) => {
            return Err(pair_cli::protect_help().into())
        }
        _ => control::parse(words)?,
    };
    // The VM resolves nothing against our directory: it gets the path
    // the user meant.
    match &mut request {
        Request::Snapshot { path, .. } => *path = std::path::absolute(&*path)?,
        Request::Protect(args) => {
            let pair = &mut args.pair;
            for path in [&mut pair.shared, &mut pair.pair_key, &mut pair.events].into_iter().flatten() {
                *path = std::path::absolute(&*path)?;
            }
        }
        _ => {}
    }
    if request == Request::Events {
        // A stream: each event as it comes, until the VM ends.
        control::follow_events(socket, json, |line| println!("{line}"))?;
        return Ok(0);
    }
    let (response, line) = control::send(socket, &request, wait)?;
    println!("{}", if json { line } else { response.to_string() });
    match response {
        Response::Ok(_) => Ok(0),
        Response::Error(e) => Err(format!("the VM answered: error {e}").into()),
    }
}

fn image_build(args: &ImageBuildArgs) -> Result<u32, Box<dyn std::error::Error>> {
    let spec = ftvm_image::ImageSpec::new(args.name.as_deref(), &args.packages, args.size.as_deref(), &args.adds)?
        .with_ssh_keys(&args.ssh_keys)?;
    let (progress, display) = progress::reporter(args.quiet);
    let runner: std::sync::Arc<dyn ftvm_image::GuestRunner> = std::sync::Arc::new(image_runner::ChildRun);
    let opts = ftvm_image::BuildOptions { force: args.force, spec, progress, runner: Some(runner), ..Default::default() };
    let built = ftvm_image::build(&opts);
    display.finish();
    let img = built?;
    println!("{}", img.kernel.parent().unwrap_or(&img.kernel).display());
    Ok(0)
}

/// `ftvm image list`: one line an image, a header first.
fn image_list() -> Result<u32, Box<dyn std::error::Error>> {
    let images = ftvm_image::list();
    if images.is_empty() {
        println!("no images in {} (`ftvm image build` makes the default one)", ftvm_image::images_dir().display());
        return Ok(0);
    }
    let width = images.iter().map(|i| i.name.len()).max().unwrap_or(4).max(4);
    println!("{:width$}  {:>9}  {:>9}  PACKAGES (beyond the default)", "NAME", "ON DISK", "ROOT");
    for i in images {
        let on_disk = format!("{:.0} MiB", i.disk_bytes as f64 / (1 << 20) as f64);
        match i.stamp {
            Ok(st) => {
                let root = format!("{} MiB", st.rootfs_bytes() >> 20);
                let mut extra =
                    if st.extra_packages.is_empty() { "-".to_string() } else { st.extra_packages.join(",") };
                // (`SOURCE:/PATH DIGEST`: the digest is no news to a user)
                for a in &st.added {
                    extra.push_str(&format!(" +{}", a.rsplit_once(' ').map_or(a.as_str(), |(added, _)| added)));
                }
                println!("{:width$}  {on_disk:>9}  {root:>9}  {extra}", i.name);
            }
            Err(e) => println!("{:width$}  {on_disk:>9}  {:>9}  unusable: {}", i.name, "?", e.cause),
        }
    }
    Ok(0)
}

/// `--log-level`, else `RUST_LOG`, else warnings only: the host library's
/// diagnostics through `tracing`, on stderr. (What a user is told, errors
/// and notices, is printed as before whatever the level.)
fn init_logging(level: Option<&str>) -> Result<(), String> {
    use tracing_subscriber::filter::{EnvFilter, LevelFilter};
    let parse = |what: &str, text: &str| -> Result<EnvFilter, String> {
        // A bare word must be a level: a misspelt one would otherwise be
        // taken for a module name, and show nothing.
        if !text.contains(['=', ',', ':', '[']) && text.parse::<LevelFilter>().is_err() {
            return Err(format!(
                "{what} {text:?} is not a level (error, warn, info, debug, trace, off) or a tracing filter"
            ));
        }
        EnvFilter::try_new(text).map_err(|e| format!("{what} {text:?}: {e}"))
    };
    let filter = match (level, std::env::var("RUST_LOG")) {
        (Some(l), _) => parse("--log-level", l)?,
        (None, Ok(v)) if !v.trim().is_empty() => parse("RUST_LOG", &v)?,
        _ => EnvFilter::new("warn"),
    };
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    Ok(())
}

/// `ftvm list`: a table (or JSON lines) of the VMs registered on this host.
fn list(json: bool) -> Result<u32, Box<dyn std::error::Error>> {
    let vms = ftvm_vmm::registry::list(ftvm_vmm::registry::ANSWER_WAIT);
    if json {
        for vm in &vms {
            println!("{}", serde_json::to_string(vm)?);
        }
        return Ok(0);
    }
    println!("{:<8} {:<12} {:<12} {:<40} STATE", "PID", "COMMAND", "ROLE", "SOCKET");
    for vm in &vms {
        println!(
            "{:<8} {:<12} {:<12} {:<40} {}",
            vm.pid,
            vm.command,
            vm.role.as_deref().unwrap_or("-"),
            vm.socket.display(),
            vm.state
        );
    }
    Ok(0)
}

/// `ftvm man`: the man page of `ftvm` on stdout, or one a command in DIR.
fn man(dir: Option<&std::path::Path>) -> Result<u32, Box<dyn std::error::Error>> {
    let cmd = Cli::command();
    match dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            clap_mangen::generate_to(cmd, dir)?;
            println!("{}", dir.display());
        }
        None => clap_mangen::Man::new(cmd).render(&mut std::io::stdout())?,
    }
    Ok(0)
}
