from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from accounts.models import Account, ApiKey
from accounts.selectors import api_key_authenticate
from catalog.models import PublicModel
from tests.factories import make_account, make_model

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]
ROOT = Path(__file__).resolve().parent.parent


def run(*args: str) -> str:
    from io import StringIO

    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_createaccount_prints_the_id_last_and_makes_the_owner_login(monkeypatch):
    monkeypatch.setenv("SPEEDINFER_PASSWORD", "s3cret-pass-word")
    out = run("createaccount", "acme", "--owner", "Ops@Acme.test")
    account = Account.objects.get(name="acme")
    assert out.strip().splitlines()[-1] == str(account.pk)
    assert account.memberships.get().user.check_password("s3cret-pass-word")
    with pytest.raises(CommandError, match="already exists"):
        run("createaccount", "acme")


def test_grantcredits_by_name_or_id_with_exact_decimals():
    account = make_account(name="acme")
    run("grantcredits", "acme", "12.5", "--note", "welcome")
    run("grantcredits", str(account.pk), "0.000001")
    account.refresh_from_db()
    assert account.available == 12_500_001
    for bad, message in (("abc", "not a decimal"), ("1.0000001", "6 decimal"), ("0", "zero")):
        with pytest.raises(CommandError, match=message):
            run("grantcredits", "acme", bad)
    with pytest.raises(CommandError, match="no account"):
        run("grantcredits", "nobody", "1")


def test_createapikey_prints_a_working_secret_once():
    make_account(name="acme")
    make_model(model_id="acme/model-1")
    out = run(
        "createapikey",
        "acme",
        "--name",
        "ci",
        "--scopes",
        "chat,usage",
        "--models",
        "acme/model-1",
        "--rpm",
        "60",
        "--tpm",
        "1000",
        "--expires",
        "2999-01-01",
    )
    secret = out.strip().splitlines()[-1]
    result = api_key_authenticate(raw_key=secret)
    assert result.key is not None and result.key.scopes == {"chat", "usage"} and result.key.rpm == 60
    assert secret not in "".join(ApiKey.objects.values_list("digest", flat=True))
    for args, message in (
        (("--scopes", "chat,root"), "unknown scope"),
        (("--models", "nope/x"), "unknown model"),
        (("--expires", "tomorrow"), "ISO 8601"),
        (("--expires", "2001-01-01"), "future"),
        (("--budget", "lots"), "budget: not a decimal number"),
        (("--budget", "0"), "budget: must be a positive amount"),
    ):
        with pytest.raises(CommandError, match=message):
            run("createapikey", "acme", *args)


def test_createapikey_budget_caps_the_key_per_month():
    make_account(name="acme")
    out = run("createapikey", "acme", "--name", "ci", "--budget", "5")
    assert "budget 5.000000 credits a month" in out
    assert ApiKey.objects.get(name="ci").monthly_budget == 5_000_000


def test_revokeapikey_by_prefix_or_name():
    make_account(name="acme")
    secret = run("createapikey", "acme", "--name", "ci").strip().splitlines()[-1]
    run("revokeapikey", "ci")
    assert api_key_authenticate(raw_key=secret).reason == "revoked"
    with pytest.raises(CommandError, match="no single key"):
        run("revokeapikey", "sk-si-doesnotexist")


def test_registermodel_creates_then_updates():
    run("registermodel", "acme/model-1", "--input-price", "0.5", "--output-price", "1.25", "--max-output-tokens", "256")
    run("registermodel", "acme/model-1", "--input-price", "0.75", "--output-price", "1.25")
    model = PublicModel.objects.get(model_id="acme/model-1")
    assert (model.input_price, model.output_price, model.max_output_tokens) == (750_000, 1_250_000, 256)
    with pytest.raises(CommandError, match="input-price"):
        run("registermodel", "x", "--input-price", "-1", "--output-price", "1")


def test_registermodel_takes_a_cached_input_price_and_a_media_allowance():
    out = run("registermodel", "acme/vlm", "--input-price", "1", "--output-price", "2", "--media-tokens", "1500")
    model = PublicModel.objects.get(model_id="acme/vlm")
    assert (model.media_tokens, model.cached_input_price, model.cached_input_price_or_input) == (1500, None, 1_000_000)
    assert "acme/vlm" in out
    run("registermodel", "acme/vlm", "--input-price", "1", "--output-price", "2", "--cached-input-price", "0.1")
    model.refresh_from_db()
    assert (model.media_tokens, model.cached_input_price) == (1500, 100_000)  # an update keeps what it is not given
    with pytest.raises(CommandError, match="cached-input-price"):
        run("registermodel", "acme/vlm", "--input-price", "1", "--output-price", "2", "--cached-input-price", "-1")
    with pytest.raises(CommandError, match="media_tokens"):
        run("registermodel", "acme/vlm", "--input-price", "1", "--output-price", "2", "--media-tokens", "-5")


def test_bad_input_exits_1_with_one_line_and_no_traceback(subprocess_env):
    env = subprocess_env
    proc = subprocess.run(
        [sys.executable, "manage.py", "grantcredits", "no-such-account", "5"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip() == "CommandError: account: no account 'no-such-account'"
    proc = subprocess.run(
        [sys.executable, "manage.py", "createapikey"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "required" in proc.stderr


def test_registermodel_defaults_the_output_cap_from_the_setting(settings):
    settings.SPEEDINFER_DEFAULT_MAX_OUTPUT_TOKENS = 777
    run("registermodel", "acme/capped", "--input-price", "1", "--output-price", "1")
    assert PublicModel.objects.get(model_id="acme/capped").max_output_tokens == 777


def test_operator_commands_are_audited(monkeypatch):
    from core.models import AuditLog

    monkeypatch.setenv("SPEEDINFER_PASSWORD", "s3cret-pass-word")
    run("registermodel", "acme/model-1", "--input-price", "1", "--output-price", "2")
    run("createaccount", "acme", "--owner", "ops@acme.test")
    run("grantcredits", "acme", "3", "--note", "welcome")
    run("createapikey", "acme", "--name", "ci")
    run("revokeapikey", "ci")
    rows = list(AuditLog.objects.order_by("id").values_list("actor", "action"))
    assert rows == [
        ("manage.py registermodel", "model.create"),
        ("manage.py createaccount", "account.create"),
        ("manage.py grantcredits", "credits.grant"),
        ("manage.py createapikey", "key.create"),
        ("manage.py revokeapikey", "key.revoke"),
    ]
    grant = AuditLog.objects.get(action="credits.grant")
    assert grant.detail["amount"] == "3.000000" and grant.detail["note"] == "welcome"


def test_grantcredits_messages_name_the_field_once_and_speak_credits():
    make_account(name="acme", credits=0)
    run("grantcredits", "acme", "0.5")
    with pytest.raises(CommandError) as info:
        run("grantcredits", "acme", "lots")
    assert str(info.value) == "amount: not a decimal number: 'lots'"
    with pytest.raises(CommandError) as info:
        run("grantcredits", "acme", "-1000")
    assert str(info.value) == (
        "amount: account 'acme' has 0.500000 credits available, less than the 1000.000000 to remove"
    )


def _manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def test_an_argument_type_error_is_one_line_exit_1(subprocess_env):
    proc = _manage(subprocess_env, "sweepreservations", "--older-than", "abc")
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("CommandError: argument --older-than: invalid int value: 'abc'")


@pytest.mark.parametrize(
    ("missing", "message"),
    [
        ("SECRET_KEY", "speedinfer: SECRET_KEY must be set when DEBUG is off"),
        ("ALLOWED_HOSTS", "speedinfer: ALLOWED_HOSTS must be set when DEBUG is off"),
    ],
)
def test_missing_production_settings_are_one_line_not_a_traceback(subprocess_env, missing, message):
    env = {**subprocess_env, "DEBUG": "0", "SECRET_KEY": "x" * 50, "ALLOWED_HOSTS": "example.com"}
    env.pop(missing)
    proc = _manage(env, "check")
    assert proc.returncode == 1
    assert proc.stderr.strip() == message


def test_registermodel_sets_the_kind_and_refuses_an_unknown_one():
    run("registermodel", "acme/embed-1", "--input-price", "0.1", "--output-price", "0", "--kind", "embeddings")
    run("registermodel", "acme/embed-1", "--input-price", "0.2", "--output-price", "0")  # keeps its kind
    assert PublicModel.objects.get(model_id="acme/embed-1").kind == "embeddings"
    assert PublicModel.objects.get(model_id="acme/embed-1").serves("chat") is False
    with pytest.raises(CommandError, match="kind"):
        run("registermodel", "acme/x", "--input-price", "1", "--output-price", "1", "--kind", "vision")
    assert not PublicModel.objects.filter(model_id="acme/x").exists()


@pytest.mark.parametrize("command", [["grantcredits", "acme", "1"], ["createaccount", "acme"], ["probeworkers"]])
def test_an_unreachable_database_is_one_line_exit_1(subprocess_env, command):
    env = {**subprocess_env, "DATABASE_URL": "postgres://postgres@127.0.0.1:1/speedinfer", "SPEEDINFER_DB_TIMEOUT": "1"}
    proc = _manage(env, *command)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("CommandError: DATABASE_URL: the database cannot be used: "), lines
