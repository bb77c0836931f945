// A form with data-confirm asks before it submits (the keys page's Revoke).
document.addEventListener("submit", function (event) {
  const form = event.target;
  if (form instanceof HTMLFormElement && form.dataset.confirm && !window.confirm(form.dataset.confirm)) {
    event.preventDefault();
  }
});
