// Live feed: new usage records arrive over a WebSocket and are prepended to the
// "Recent requests" table, and the overview cards follow (the server sends their
// figures, formatted as the page formats them, at most once a second). Without
// JavaScript the page is simply not live.
(function () {
  const body = document.getElementById("recent-rows");
  if (!body || !("WebSocket" in window)) return;
  const status = document.getElementById("live-status");
  const empty = document.getElementById("recent-empty");
  const maxRows = 50;
  const grouped = new Intl.NumberFormat("en-US");
  let delay = 1000;

  function cell(text, className, label) {
    const td = document.createElement("td");
    if (className) td.className = className;
    if (label) td.dataset.label = label;
    td.textContent = text;
    return td;
  }

  function addRow(u) {
    const tr = document.createElement("tr");
    tr.className = "fresh";
    tr.dataset.requestId = u.request_id;
    const time = document.createElement("td");
    const t = document.createElement("time");
    t.dateTime = u.created_at;
    t.textContent = u.created_at.replace("T", " ").slice(0, 19);
    time.dataset.label = "Time (UTC)";
    time.appendChild(t);
    tr.appendChild(time);
    tr.appendChild(cell(u.model, "mono", "Model"));
    const st = document.createElement("td");
    st.dataset.label = "Status";
    const badge = document.createElement("span");
    badge.className = "badge badge-" + u.status;
    badge.textContent = u.status_display;
    st.appendChild(badge);
    if (u.error_code) st.appendChild(document.createTextNode(" " + u.error_code));
    tr.appendChild(st);
    tr.appendChild(cell(grouped.format(u.prompt_tokens), "num", "Prompt"));
    tr.appendChild(cell(grouped.format(u.completion_tokens), "num", "Completion"));
    tr.appendChild(cell(u.cost_display || u.cost, "num", "Cost"));
    tr.appendChild(cell(grouped.format(u.latency_ms) + " ms", "num", "Latency"));
    body.insertBefore(tr, body.firstChild);
    while (body.rows.length > maxRows) body.deleteRow(body.rows.length - 1);
    if (empty) empty.hidden = true;
  }

  function setCard(id, text, exact) {
    const el = document.getElementById(id);
    if (!el) return;
    el.textContent = text;
    if (exact) el.title = exact + " credits";
  }

  function updateCards(s) {
    setCard("balance", s.available, s.available_exact);
    setCard("reserved", s.reserved, s.reserved_exact);
    setCard("spend-month", s.spend_month, s.spend_month_exact);
    setCard("requests-today", grouped.format(s.requests_today));
    setCard("tokens-today", grouped.format(s.tokens_today));
  }

  function connect() {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const socket = new WebSocket(scheme + location.host + "/ws/usage/");
    socket.onopen = () => { delay = 1000; if (status) status.hidden = false; };
    socket.onmessage = (event) => {
      const message = JSON.parse(event.data);
      if (message.type === "usage") addRow(message.usage);
      if (message.summary) updateCards(message.summary);
    };
    socket.onclose = () => {
      if (status) status.hidden = true;
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 30000);
    };
  }
  connect();
})();
