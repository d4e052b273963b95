// The dashboard's script: it puts what the agent's feed (/ui/stream,
// server-sent events) sends in its place (the server renders every piece
// of HTML), and sends the operator's actions after a confirmation. No
// library, nothing fetched from elsewhere.
"use strict";

const csrf = document.querySelector("meta[name=ftvm-csrf]").content;
const $ = (id) => document.getElementById(id);
const KEEP_ROWS = 500;

function live(ok, text) {
  const l = $("live");
  l.className = ok ? "fresh" : "stale";
  l.textContent = text;
}

function connect() {
  const feed = new EventSource("/ui/stream");
  feed.onopen = () => live(true, "live");
  feed.onerror = () => live(false, "reconnecting…");
  feed.addEventListener("view", (m) => {
    $("view").innerHTML = m.data;
  });
  feed.addEventListener("jobs", (m) => {
    $("jobs").innerHTML = m.data;
  });
  feed.addEventListener("event", (m) => {
    const body = $("events");
    // Newest first.
    body.insertAdjacentHTML("afterbegin", m.data);
    while (body.rows.length > KEEP_ROWS) body.deleteRow(body.rows.length - 1);
  });
}

// The action waiting for its confirmation.
let pending = null;

const needsHost = { protect: true, move_backup: true, move: true };
const sentence = {
  protect: (a) => `Protect ${a.vm}` + (a.host ? ` with a backup on` : ""),
  handover: (a) => `Hand ${a.vm} over to its backup now?`,
  move_backup: (a) => `Move ${a.vm}'s backup to`,
  move: (a) => `Move ${a.vm} (the guest runs on) to`,
  drain: (a) => `Drain host ${a.host}: move every VM off it?`,
  undrain: (a) => `Take host ${a.host} back into use?`,
};

function ask(button) {
  const a = { action: button.dataset.action, vm: button.dataset.vm, host: button.dataset.host };
  const select = $("confirm-host");
  select.replaceChildren();
  if (needsHost[a.action]) {
    const hosts = a.host ? a.host.split(",") : [];
    if (a.action === "protect") select.add(new Option("(the controller chooses)", ""));
    for (const h of hosts) select.add(new Option(h, h));
    select.hidden = false;
  } else {
    select.hidden = true;
  }
  $("confirm-text").textContent = sentence[a.action] ? sentence[a.action](a) : a.action;
  pending = a;
  $("confirm").hidden = false;
  $("confirm-yes").focus();
}

async function send(a) {
  const body = { action: a.action };
  if (a.vm) body.vm = a.vm;
  if (needsHost[a.action]) {
    body.host = $("confirm-host").value;
  } else if (a.host) {
    body.host = a.host;
  }
  try {
    const r = await fetch("/ui/actions", {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-Ftvm-Csrf": csrf },
      body: JSON.stringify(body),
      credentials: "same-origin",
    });
    if (!r.ok) {
      const e = await r.json().catch(() => ({ message: r.statusText }));
      refused(e.message || r.statusText);
    }
  } catch (e) {
    refused(String(e));
  }
}

function refused(message) {
  const li = document.createElement("p");
  li.className = "job bad";
  li.textContent = "refused: " + message;
  $("jobs").prepend(li);
}

document.addEventListener("click", (ev) => {
  const b = ev.target.closest("button");
  if (!b) return;
  if (b.classList.contains("action")) {
    ask(b);
  } else if (b.id === "confirm-yes" && pending) {
    const a = pending;
    pending = null;
    $("confirm").hidden = true;
    send(a);
  } else if (b.id === "confirm-no") {
    pending = null;
    $("confirm").hidden = true;
  } else if (b.id === "logout") {
    fetch("/ui/logout", { method: "POST", headers: { "X-Ftvm-Csrf": csrf } }).finally(() => location.reload());
  }
});

connect();
