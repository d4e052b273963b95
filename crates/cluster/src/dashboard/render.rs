//! The dashboard's HTML, made on the server: the login form, the page's
//! frame, the cluster's view (hosts, VMs with their charts as plain SVG),
//! a row of the timeline per event, the actions' panel. Every text that
//! comes from outside (names, problems, messages) goes through [`esc`].

use super::view::{Health, Protection, View, VmRow, HISTORY_MS};
use super::Job;
use crate::control::events::{ClusterEvent, ControllerAction, Meaning, What};
use ftvm_api::events::PairEvent;
use std::fmt::Write;

/// `s` safe in HTML text and in a quoted attribute.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn head(title: &str) -> String {
    format!(
        "<!doctype html><html lang=en><head><meta charset=utf-8><meta name=viewport \
         content=\"width=device-width\"><title>{}</title><link rel=stylesheet href=\"/ui/style.css\"><link rel=icon \
         href=\"/ui/icon.svg\">",
        esc(title)
    )
}

/// The form that asks for the cluster's token; `refusal`: why the last
/// try was refused, in one line.
pub fn login(host: &str, refusal: Option<&str>) -> String {
    let said = refusal.map(|r| format!("<p class=refusal id=refusal>{}</p>", esc(r))).unwrap_or_default();
    format!(
        "{}</head><body class=login><main><h1>ftvm cluster</h1><p>Agent on host <b>{}</b>. The dashboard needs \
         the cluster's API token.</p>{said}<form method=post action=\"/ui/login\"><label>Token <input \
         type=password name=token id=token autocomplete=current-password autofocus required></label> <button \
         id=login>Log in</button></form></main></body></html>",
        head("ftvm: log in"),
        esc(host)
    )
}

/// The form of a new VM (`ftvm cluster vm create`'s options), outside the
/// view so that the feed's updates leave what is typed alone; the script
/// fills the image and host choices from the view's host rows when it
/// opens, and sends it as a `create` action.
const CREATE_FORM: &str = "<section id=create hidden><h2>New VM</h2><form id=create-form>\
    <label>Name <input name=name required maxlength=64></label> \
    <label>Image <select name=image id=create-image></select></label> \
    <label>Memory (MiB) <input name=memory_mib type=number min=16 max=65536 value=512></label> \
    <label>Harts <input name=cpus type=number min=1 max=8 value=1></label> \
    <label>Root disk (MiB; empty: the image's) <input name=disk_mib type=number min=256></label><br>\
    <label>Protection <select name=protect><option value=\"\">none</option><option value=checkpoint>checkpoint</option>\
    <option value=lockstep>lockstep</option><option value=epoch>epoch</option></select></label> \
    <label>Bridge <input name=bridge maxlength=15></label> \
    <label>Address <input name=ip placeholder=\"10.0.0.5/24\"></label> \
    <label>Host <select name=host id=create-host></select></label><br>\
    <label>Command (empty: the image's services) <input name=command size=60></label><br>\
    <label>Root's ssh keys (one .pub line each) <textarea name=ssh_keys rows=2 cols=60></textarea></label><br>\
    <button type=submit id=create-yes>Create</button> <button type=button id=create-no>Cancel</button>\
    </form></section>";

/// The page: its frame around the view as it stands, the CSRF value the
/// script sends with each action.
pub fn page(host: &str, csrf: &str, view: &str, jobs: &str) -> String {
    format!(
        "{}<meta name=ftvm-csrf content=\"{}\"><script src=\"/ui/app.js\" defer></script></head><body>\
         <header><h1>ftvm cluster</h1><span>served by <b>{}</b></span><span id=live class=stale>connecting…</span>\
         <button type=button id=create-open>New VM…</button>\
         <form method=post action=\"/ui/logout\" id=logout-form><button type=button id=logout>Log out</button></form>\
         </header>{CREATE_FORM}<div id=confirm hidden><span id=confirm-text></span> <select id=confirm-host hidden></select> \
         <button id=confirm-yes>Confirm</button> <button id=confirm-no>Cancel</button></div>\
         <section id=jobs>{jobs}</section><section id=console hidden><h2>Console of <span id=console-vm></span> \
         <span id=console-state></span> <button id=console-close>close</button></h2><pre id=console-out></pre>\
         <label>Type <input id=console-in autocomplete=off spellcheck=false disabled></label> (Enter sends the line)\
         </section><main id=view>{view}</main><section><h2>Timeline</h2>\
         <table id=timeline><thead><tr><th>time (UTC)</th><th>host</th><th>VM</th><th>what</th></tr></thead>\
         <tbody id=events></tbody></table></section></body></html>",
        head("ftvm cluster"),
        esc(csrf),
        esc(host)
    )
}

fn mib(bytes: u64) -> String {
    format!("{} MiB", bytes >> 20)
}

/// `unix_ms` as `HH:MM:SS` UTC.
pub fn clock(unix_ms: u64) -> String {
    let s = unix_ms / 1000;
    format!("{:02}:{:02}:{:02}", (s / 3600) % 24, (s / 60) % 60, s % 60)
}

/// The cluster: its hosts, its VMs.
pub fn view(v: &View) -> String {
    let mut o = String::new();
    let _ = write!(o, "<p class=asof>as of <span id=asof>{}</span> UTC", clock(v.unix_ms));
    if !v.etcd_answers {
        o.push_str(" <b class=bad>etcd does not answer: hosts as last seen</b>");
    }
    o.push_str(
        "</p><h2>Hosts</h2><table id=hosts><thead><tr><th>host</th><th>health</th><th>cores</th>\
                <th>memory</th><th>free for VMs</th><th>images</th><th>VMs</th><th></th></tr></thead><tbody>",
    );
    for h in &v.hosts {
        let (class, health) = match &h.health {
            Health::Up if h.drained => ("warn", "up, drained".to_string()),
            Health::Up => ("ok", "up".to_string()),
            Health::NotAnswering(e) => ("bad", format!("agent not answering: {e}")),
            Health::Lost { last_seen_ms } => ("bad", format!("lost (last seen {})", clock(*last_seen_ms))),
        };
        let vms: Vec<String> = h.vms.iter().map(|(n, r)| format!("{} ({})", esc(n), r.word())).collect();
        let action = match (&h.health, h.drained) {
            (Health::Lost { .. }, _) => String::new(),
            (_, false) => action_button("drain", "", &h.id, "drain"),
            (_, true) => action_button("undrain", "", &h.id, "undrain"),
        };
        let _ = write!(
            o,
            "<tr data-host=\"{id}\" data-images=\"{}\" data-up=\"{}\"><td>{id}</td><td class=\"health {class}\">{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td class=images>{}</td><td>{}</td><td>{action}</td></tr>",
            esc(&h.images.join(",")),
            h.health == Health::Up && !h.drained,
            esc(&health),
            h.cores,
            mib(h.memory_bytes),
            mib(h.free_memory_bytes),
            esc(&h.images.join(", ")),
            vms.join(", "),
            id = esc(&h.id)
        );
    }
    o.push_str("</tbody></table><h2>VMs</h2>");
    if v.vms.is_empty() {
        o.push_str("<p>No VM.</p>");
    }
    let hosts: Vec<&str> =
        v.hosts.iter().filter(|h| h.health == Health::Up && !h.drained).map(|h| h.id.as_str()).collect();
    for vm in &v.vms {
        vm_card(&mut o, vm, &hosts);
    }
    o
}

fn action_button(action: &str, vm: &str, host: &str, label: &str) -> String {
    format!(
        "<button class=action data-action=\"{}\" data-vm=\"{}\" data-host=\"{}\">{}</button>",
        esc(action),
        esc(vm),
        esc(host),
        esc(label)
    )
}

fn vm_card(o: &mut String, vm: &VmRow, up_hosts: &[&str]) {
    let (class, state) = match &vm.protection {
        Protection::Protected => ("ok", "protected".to_string()),
        Protection::Protecting { round, percent } => ("warn", format!("protecting {percent}% (round {round})")),
        Protection::Unprotected => ("warn", "unprotected".to_string()),
        Protection::WaitingForHost(None) => ("bad", "waiting for a host".to_string()),
        Protection::WaitingForHost(Some(p)) => ("bad", format!("waiting for a host: {p}")),
        Protection::Starting => ("warn", "starting".to_string()),
        Protection::NotRunning => ("bad", "not running".to_string()),
    };
    let f = &vm.figures;
    let num = |x: Option<f64>, unit: &str, digits: usize| x.map_or("–".into(), |x| format!("{x:.digits$} {unit}"));
    let _ = write!(
        o,
        "<article class=vm data-vm=\"{name}\"><h3>{name} <span class=\"protection {class}\" data-state=\"{}\">{}</span>\
         </h3><dl><dt>primary</dt><dd class=primary>{}</dd><dt>backup</dt><dd class=backup>{}</dd><dt>mode</dt>\
         <dd>{}</dd><dt>image</dt><dd class=image>{}</dd><dt>lag</dt><dd class=lag>{}</dd><dt>log bandwidth</dt><dd class=bandwidth>{}</dd>\
         <dt>outputs held</dt><dd>{}</dd>",
        state_word(&vm.protection),
        esc(&state),
        esc(vm.primary.as_deref().unwrap_or("–")),
        esc(vm.backup.as_deref().unwrap_or("–")),
        esc(&vm.mode),
        esc(&vm.image),
        num(f.lag_ms, "ms", 0),
        num(f.mbit_s, "Mbit/s", 2),
        f.outputs_held.map_or("–".into(), |h| h.to_string()),
        name = esc(&vm.name)
    );
    if let Some(rate) = f.checkpoint_rate {
        let us = |x: Option<u64>| x.map_or("–".into(), |x| format!("{:.2} ms", x as f64 / 1000.0));
        let _ = write!(
            o,
            "<dt>checkpoints</dt><dd>{rate:.1}/s</dd><dt>pause p50 / p99</dt><dd>{} / {}</dd>",
            us(f.pause_median_us),
            us(f.pause_p99_us)
        );
    }
    o.push_str("</dl><div class=charts>");
    let lag: Vec<(u64, Option<f64>)> = vm.history.iter().map(|(t, l, _)| (*t, *l)).collect();
    let bw: Vec<(u64, Option<f64>)> = vm.history.iter().map(|(t, _, b)| (*t, *b)).collect();
    chart(o, "lag, ms", &lag);
    chart(o, "log bandwidth, Mbit/s", &bw);
    o.push_str("</div><p class=actions>");
    let others: Vec<&str> = up_hosts.iter().copied().filter(|h| Some(*h) != vm.primary.as_deref()).collect();
    let choices = others.iter().filter(|h| Some(**h) != vm.backup.as_deref()).copied().collect::<Vec<_>>().join(",");
    let running = vm.primary.is_some();
    // "protect…" always offers "the controller chooses"; a move is offered
    // only with a host to move to (with none, say the only other host
    // drained, its confirmation could only be refused).
    if running && vm.backup.is_none() {
        o.push_str(&action_button("protect", &vm.name, &choices, "protect…"));
    }
    if running && vm.backup.is_some() {
        o.push_str(&action_button("handover", &vm.name, "", "handover"));
        if !choices.is_empty() {
            o.push_str(&action_button("move_backup", &vm.name, &choices, "move backup…"));
        }
    }
    if running && !others.is_empty() {
        o.push_str(&action_button("move", &vm.name, &others.join(","), "move VM…"));
    }
    // The console opens in the page (the script's), not as an action.
    if running {
        let _ = write!(o, "<button class=console-open data-vm=\"{}\">console</button>", esc(&vm.name));
    }
    o.push_str("</p></article>");
}

/// The word the test and the script read a VM's state by.
fn state_word(p: &Protection) -> &'static str {
    match p {
        Protection::Protected => "protected",
        Protection::Protecting { .. } => "protecting",
        Protection::Unprotected => "unprotected",
        Protection::WaitingForHost(_) => "waiting",
        Protection::Starting => "starting",
        Protection::NotRunning => "not-running",
    }
}

/// A small line chart of the last minutes (of as much as was looked at,
/// up to [`HISTORY_MS`]): a gap where there was no figure (the VM
/// unprotected, its agent not answering); a lone figure is a dot.
fn chart(o: &mut String, title: &str, points: &[(u64, Option<f64>)]) {
    const W: f64 = 240.0;
    const H: f64 = 48.0;
    let end = points.last().map_or(0, |p| p.0);
    let start = points.first().map_or(0, |p| p.0).max(end.saturating_sub(HISTORY_MS));
    let span = (end - start).max(1) as f64;
    let top = points.iter().filter_map(|p| p.1).fold(0.0_f64, f64::max);
    let scale = if top > 0.0 { top * 1.1 } else { 1.0 };
    let mut paths = String::new();
    let mut pen_down = false;
    for (t, y) in points.iter().filter(|p| p.0 >= start) {
        match y {
            Some(y) => {
                let x = t.saturating_sub(start) as f64 / span * W;
                let yy = H - y / scale * H;
                if pen_down {
                    let _ = write!(paths, "L{x:.1},{yy:.1} ");
                } else {
                    // A zero-length segment: round caps draw it as a dot.
                    let _ = write!(paths, "M{x:.1},{yy:.1} l0,0 ");
                }
                pen_down = true;
            }
            None => pen_down = false,
        }
    }
    let last = points.last().and_then(|p| p.1).map_or("–".into(), |v| format!("{v:.1}"));
    let _ = write!(
        o,
        "<figure><figcaption>{} <b>{last}</b> <small>(max {top:.1}, last {} s)</small></figcaption><svg \
         width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" role=img><rect width=\"{W}\" height=\"{H}\" \
         class=bg /><path d=\"{}\" class=line /></svg></figure>",
        esc(title),
        (end - start) / 1000,
        paths.trim_end()
    );
}

/// What an event says, in words.
fn words(e: &ClusterEvent, meaning: Option<Meaning>) -> (String, &'static str) {
    match &e.what {
        What::Pair { event } => match (event, meaning) {
            (PairEvent::GoingLive { .. }, Some(Meaning::Failover)) => ("went live: failover".into(), "bad"),
            (PairEvent::GoingLive { .. }, _) => ("went live: handover".into(), "ok"),
            (PairEvent::Protected { mode, .. }, Some(Meaning::Reprotection)) => {
                (format!("re-protected ({mode})"), "ok")
            }
            (PairEvent::Protected { mode, backup, .. }, _) => (format!("protected ({mode}, backup {backup})"), "ok"),
            (PairEvent::DeclaredFailed { who, reason }, _) => (format!("failure declared: {who} ({reason})"), "bad"),
            (PairEvent::ArbiterWon { generation }, _) => (format!("arbiter won (generation {generation})"), "warn"),
            (PairEvent::ArbiterLost { winner, .. }, _) => (format!("arbiter lost to {winner}"), "warn"),
            (PairEvent::HandingOver { .. }, _) => ("handing over".into(), "warn"),
            (PairEvent::HandedOver { .. }, _) => ("handed over".into(), "ok"),
            (PairEvent::HandOverReceived { .. }, _) => ("handover received".into(), "warn"),
            (PairEvent::HandOverFailed { .. }, _) => ("handover failed".into(), "bad"),
            (PairEvent::ProtectionFailed { .. }, _) => ("protection failed".into(), "bad"),
            (PairEvent::ProtectionStopped { .. }, _) => ("protection stopped".into(), "warn"),
            (PairEvent::Unprotected { .. }, _) => ("runs unprotected".into(), "warn"),
            (PairEvent::Protecting { .. }, _) => ("protecting".into(), "warn"),
            _ => {
                // The rest by their names in the log.
                let name = serde_json::to_value(event)
                    .ok()
                    .and_then(|v| v.get("event").and_then(|t| t.as_str()).map(|t| t.replace('_', " ")))
                    .unwrap_or_default();
                (name, "")
            }
        },
        What::Controller { action } => (
            match action {
                ControllerAction::Start { on } => format!("controller: start on {on}"),
                ControllerAction::Protect { on, mode } => format!("controller: backup on {on} ({mode})"),
                ControllerAction::MoveBackup { from, to } => format!("controller: move backup {from} → {to}"),
                ControllerAction::Handover { from } => format!("controller: handover from {from}"),
                ControllerAction::Move { from, to } => format!("controller: move {from} → {to}"),
                ControllerAction::Unprotect { primary } => format!("controller: unprotect on {primary}"),
                ControllerAction::StopOrphan { on } => format!("controller: stop the backup left waiting on {on}"),
                ControllerAction::Failed { problem } => format!("controller: failed: {problem}"),
            },
            "ctl",
        ),
    }
}

/// A row of the timeline.
pub fn event_row(e: &ClusterEvent, meaning: Option<Meaning>) -> String {
    let (what, class) = words(e, meaning);
    let kind = match meaning {
        Some(Meaning::Failover) => "failover",
        Some(Meaning::Handover) => "handover",
        Some(Meaning::Reprotection) => "reprotection",
        None => "",
    };
    format!(
        "<tr class=\"{class}\" data-id=\"{}\" data-kind=\"{kind}\"><td>{}.{:03}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        e.id,
        clock(e.unix_ms),
        e.unix_ms % 1000,
        esc(&e.host),
        esc(e.vm.as_deref().unwrap_or("–")),
        esc(&what)
    )
}

/// The actions asked from this agent's dashboard, newest first.
pub fn jobs(jobs: &[Job]) -> String {
    if jobs.is_empty() {
        return String::new();
    }
    let mut o = String::from("<h2>Actions</h2><ul>");
    for j in jobs.iter().rev() {
        let (class, state) = match &j.result {
            None => ("warn", format!("running for {} s…", j.elapsed_s())),
            Some(Ok(m)) => ("ok", format!("done: {m}")),
            Some(Err(m)) => ("bad", format!("failed: {m}")),
        };
        let _ = write!(
            o,
            "<li class=\"job {class}\" data-job=\"{}\" data-done=\"{}\">{} {} — {}</li>",
            j.id,
            match &j.result {
                None => "running",
                Some(Ok(_)) => "ok",
                Some(Err(_)) => "failed",
            },
            clock(j.started_ms),
            esc(&j.what),
            esc(&state)
        );
    }
    o.push_str("</ul>");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outside_text_cannot_make_markup() {
        assert_eq!(esc("<script>\"x\"&'y'"), "&lt;script&gt;&quot;x&quot;&amp;&#39;y&#39;");
        let page = login("h<1>", Some("wrong \"token\""));
        assert!(page.contains("h&lt;1&gt;") && page.contains("wrong &quot;token&quot;"), "{page}");
    }

    #[test]
    fn a_move_is_offered_only_with_a_host_to_move_to() {
        let vm = VmRow {
            name: "redis".into(),
            primary: Some("a".into()),
            backup: Some("b".into()),
            mode: "checkpoint".into(),
            image: "trixie-riscv64".into(),
            protection: Protection::Protected,
            figures: Default::default(),
            history: Vec::new(),
        };
        // Host c drained: only the VM's own two hosts are up for it.
        let mut o = String::new();
        vm_card(&mut o, &vm, &["a", "b"]);
        assert!(!o.contains("data-action=\"move_backup\""), "{o}");
        assert!(o.contains("data-action=\"move\" data-vm=\"redis\" data-host=\"b\""), "{o}");
        let mut o = String::new();
        vm_card(&mut o, &vm, &["a", "b", "c"]);
        assert!(o.contains("data-action=\"move_backup\" data-vm=\"redis\" data-host=\"c\""), "{o}");
        // Alone in the cluster: nowhere to move it.
        let mut o = String::new();
        vm_card(&mut o, &VmRow { backup: None, ..vm }, &["a"]);
        assert!(!o.contains("data-action=\"move\""), "{o}");
        assert!(o.contains("data-action=\"protect\""), "{o}");
        assert!(o.contains("<button class=console-open data-vm=\"redis\">"), "{o}");
    }

    #[test]
    fn a_chart_leaves_a_gap_where_there_was_no_figure() {
        let mut o = String::new();
        chart(&mut o, "lag", &[(0, Some(1.0)), (1000, None), (2000, Some(2.0)), (3000, Some(2.0))]);
        assert_eq!(o.matches('M').count(), 2, "{o}");
        assert!(o.contains("<b>2.0</b>"), "{o}");
    }
}
