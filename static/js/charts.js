// Draws the usage page's charts from the JSON the server embedded (json_script).
(function () {
  const source = document.getElementById("chart-data");
  if (!source || typeof Chart === "undefined") return;
  const data = JSON.parse(source.textContent);
  const palette = ["#2f6fed", "#12b76a", "#f79009", "#9e77ed", "#f04438", "#06aed4", "#667085", "#ee46bc"];

  function datasets(series) {
    return Object.keys(series).sort().map((model, i) => ({
      label: model,
      data: series[model],
      backgroundColor: palette[i % palette.length],
      borderWidth: 0,
      stack: "models",
    }));
  }

  // Axis numbers as people write them: "0.000035", "1,200", never "3.500000E-5".
  const readable = new Intl.NumberFormat("en-US", { maximumFractionDigits: 6 });

  const wholeNumbers = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });

  function draw(id, series, label, integral) {
    const canvas = document.getElementById(id);
    if (!canvas) return;
    new Chart(canvas, {
      type: "bar",
      data: { labels: data.days, datasets: datasets(series) },
      options: {
        responsive: true,
        maintainAspectRatio: false,
        animation: false,
        interaction: { mode: "index", intersect: false },
        plugins: {
          legend: { position: "bottom" },
          tooltip: { callbacks: { label: (ctx) => `${ctx.dataset.label}: ${readable.format(ctx.parsed.y)} ${label}` } },
        },
        scales: {
          x: { stacked: true, grid: { display: false } },
          y: {
            stacked: true,
            beginAtZero: true,
            title: { display: true, text: label },
            // Tokens come whole: an empty chart's axis shows 0, 1, 2, never 0.2 tokens.
            suggestedMax: integral ? 1 : undefined,
            ticks: integral
              ? { precision: 0, callback: (value) => (Number.isInteger(value) ? wholeNumbers.format(value) : null) }
              : { callback: (value) => readable.format(value) },
          },
        },
      },
    });
  }

  draw("tokens-chart", data.tokens, "tokens", true);
  draw("cost-chart", data.cost, "credits", false);
})();
