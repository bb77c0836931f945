"""Teams: members and roles on the dashboard, invitations, and the addmember / removemember commands.

The persona matrix signs in as an owner, a developer and a viewer of one account, an outsider (an
owner of another account) and staff (no account), and walks every dashboard page and action.
"""

from __future__ import annotations

import re
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.core import mail
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.utils import timezone

from accounts.models import ApiKey, Invitation, Membership
from accounts.services import account_user_create, invitation_create
from core.credits import MICRO
from core.models import AuditLog
from tests.factories import make_account, make_key, make_member, make_model

pytestmark = pytest.mark.django_db
PASSWORD = "correct horse battery staple"
PERSONAS = ("owner", "developer", "viewer", "outsider", "staff")


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    # Each persona has a password; the production hasher's rounds would make the matrix take minutes.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def team():
    """Owner Co with one member per role (plus a target developer and a key and an invitation
    that the actions aim at) and Outsider Inc with its own owner."""
    make_model(model_id="acme/team-model")
    account = make_account(name="Owner Co", credits=10)
    outsider_account = make_account(name="Outsider Inc", credits=3)
    users = {
        "owner": account_user_create(account=account, email="owner@example.com", password=PASSWORD),
        "developer": make_member(account=account, email="dev@example.com", role="developer").membership.user,
        "viewer": make_member(account=account, email="viewer@example.com", role="viewer").membership.user,
        "outsider": account_user_create(account=outsider_account, email="out@example.com", password=PASSWORD),
        "staff": get_user_model().objects.create_user(username="staff@example.com", password=PASSWORD, is_staff=True),
    }
    target = make_member(account=account, email="target@example.com", role="developer").membership
    key = make_key(account=account, name="shared").api_key
    invitation = invitation_create(account=account, email="later@example.com", role="viewer").invitation
    return {"account": account, "users": users, "target": target, "key": key, "invitation": invitation}


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


GET_PAGES = {
    # page: the persona's expected status; the outsider sees their own account's pages.
    "/dashboard/": dict(owner=200, developer=200, viewer=200, outsider=200, staff=403),
    "/dashboard/usage/": dict(owner=200, developer=200, viewer=200, outsider=200, staff=403),
    "/dashboard/usage.csv": dict(owner=200, developer=200, viewer=200, outsider=200, staff=403),
    "/dashboard/models/": dict(owner=200, developer=200, viewer=200, outsider=200, staff=403),
    "/dashboard/keys/": dict(owner=200, developer=200, viewer=403, outsider=200, staff=403),
    "/dashboard/keys/created/": dict(owner=302, developer=302, viewer=403, outsider=302, staff=403),
    "/dashboard/members/": dict(owner=200, developer=403, viewer=403, outsider=200, staff=403),
}


@pytest.mark.parametrize("persona", PERSONAS)
@pytest.mark.parametrize("url", list(GET_PAGES))
def test_every_page_answers_each_persona_by_role(team, url, persona):
    response = signed_in(team["users"][persona]).get(url)
    assert response.status_code == GET_PAGES[url][persona]
    if response.status_code == 200 and url != "/dashboard/usage.csv":
        html = response.content.decode()
        mine = "Outsider Inc" if persona == "outsider" else "Owner Co"
        other = "Owner Co" if persona == "outsider" else "Outsider Inc"
        assert mine in html and other not in html


def _key(team):
    return ApiKey.objects.get(pk=team["key"].pk)


# action: (method path builder, form data, what "it happened" reads, expected status per persona).
# Targets belong to Owner Co, so the outsider gets 404 for them; the create/invite forms act on the
# outsider's own account (302) and are checked there.
ACTIONS = {
    "create key": (
        lambda t: "/dashboard/keys/",
        {"name": "new-one", "scopes": ["chat"]},
        lambda t: ApiKey.objects.filter(account=t["account"], name="new-one").exists(),
        dict(owner=302, developer=302, viewer=403, outsider=302, staff=403),
    ),
    "create key with a budget": (
        lambda t: "/dashboard/keys/",
        {"name": "capped", "scopes": ["chat"], "budget": "5"},
        lambda t: ApiKey.objects.filter(account=t["account"], name="capped").exists(),
        dict(owner=302, developer=403, viewer=403, outsider=302, staff=403),
    ),
    "revoke key": (
        lambda t: f"/dashboard/keys/{t['key'].pk}/revoke/",
        {},
        lambda t: _key(t).revoked_at is not None,
        dict(owner=302, developer=302, viewer=403, outsider=404, staff=403),
    ),
    "set budget": (
        lambda t: f"/dashboard/keys/{t['key'].pk}/budget/",
        {"budget": "2"},
        lambda t: _key(t).monthly_budget == 2 * MICRO,
        dict(owner=302, developer=403, viewer=403, outsider=404, staff=403),
    ),
    "invite": (
        lambda t: "/dashboard/members/",
        {"email": "new@example.com", "role": "viewer"},
        lambda t: Invitation.objects.filter(account=t["account"], email="new@example.com").exists(),
        dict(owner=302, developer=403, viewer=403, outsider=302, staff=403),
    ),
    "change role": (
        lambda t: f"/dashboard/members/{t['target'].pk}/role/",
        {"role": "viewer"},
        lambda t: Membership.objects.get(pk=t["target"].pk).role == "viewer",
        dict(owner=302, developer=403, viewer=403, outsider=404, staff=403),
    ),
    "remove member": (
        lambda t: f"/dashboard/members/{t['target'].pk}/remove/",
        {},
        lambda t: not Membership.objects.filter(pk=t["target"].pk).exists(),
        dict(owner=302, developer=403, viewer=403, outsider=404, staff=403),
    ),
    "withdraw invitation": (
        lambda t: f"/dashboard/members/invitations/{t['invitation'].pk}/revoke/",
        {},
        lambda t: Invitation.objects.get(pk=t["invitation"].pk).revoked_at is not None,
        dict(owner=302, developer=403, viewer=403, outsider=404, staff=403),
    ),
}


@pytest.mark.parametrize("persona", PERSONAS)
@pytest.mark.parametrize("action", list(ACTIONS))
def test_every_action_is_allowed_exactly_by_role(team, action, persona):
    path, data, happened, expected = ACTIONS[action]
    response = signed_in(team["users"][persona]).post(path(team), data)
    assert response.status_code == expected[persona]
    # Owner Co changed exactly when one of its own members with the power acted.
    assert happened(team) is (persona in ("owner", "developer") and response.status_code == 302)
    if persona == "outsider" and response.status_code == 302:
        # The outsider's forms act on their own account only.
        assert happened({**team, "account": team["users"]["outsider"].membership.account})


def test_viewer_sees_no_key_or_member_links_and_developer_no_budget_form(team):
    viewer = signed_in(team["users"]["viewer"]).get("/dashboard/").content.decode()
    assert 'href="/dashboard/keys/"' not in viewer and 'href="/dashboard/members/"' not in viewer
    assert "viewer@example.com · Owner Co · viewer" in viewer
    keys = signed_in(team["users"]["developer"]).get("/dashboard/keys/").content.decode()
    assert "/budget/" not in keys and 'name="budget"' not in keys and "Revoke" in keys
    assert 'href="/dashboard/members/"' not in keys
    owner = signed_in(team["users"]["owner"]).get("/dashboard/keys/").content.decode()
    assert "/budget/" in owner and 'href="/dashboard/members/"' in owner


def test_a_removed_member_loses_access_on_their_next_request(team):
    developer = signed_in(team["users"]["developer"])
    assert developer.get("/dashboard/keys/").status_code == 200
    owner = signed_in(team["users"]["owner"])
    membership = team["users"]["developer"].membership
    assert owner.post(f"/dashboard/members/{membership.pk}/remove/").status_code == 302
    # The same session cookie, next request: refused, and the session is gone from the store.
    assert developer.get("/dashboard/keys/").status_code in (302, 403)
    assert developer.get("/dashboard/").status_code in (302, 403)
    dev_id = str(team["users"]["developer"].pk)
    assert not [s for s in Session.objects.all() if s.get_decoded().get("_auth_user_id") == dev_id]
    entry = AuditLog.objects.get(action="member.remove")
    assert entry.actor == "owner@example.com" and entry.detail["email"] == "dev@example.com"


def test_a_role_change_applies_on_the_next_request(team):
    developer = signed_in(team["users"]["developer"])
    assert developer.get("/dashboard/keys/").status_code == 200
    owner = signed_in(team["users"]["owner"])
    owner.post(f"/dashboard/members/{team['users']['developer'].membership.pk}/role/", {"role": "viewer"})
    assert developer.get("/dashboard/keys/").status_code == 403
    entry = AuditLog.objects.get(action="member.role")
    assert entry.detail == {
        "via": "dashboard",
        "email": "dev@example.com",
        "role": "viewer",
        "role_before": "developer",
    }


def test_the_last_owner_can_neither_leave_nor_be_demoted(team):
    owner = signed_in(team["users"]["owner"])
    own = team["users"]["owner"].membership
    page = owner.post(f"/dashboard/members/{own.pk}/role/", {"role": "viewer"}, follow=True)
    assert "last owner" in page.content.decode()
    page = owner.post(f"/dashboard/members/{own.pk}/remove/", follow=True)
    assert "last owner" in page.content.decode()
    assert Membership.objects.get(pk=own.pk).role == "owner"


def _link(message) -> str:
    match = re.search(r"http://testserver(/accounts/invite/[^/\s]+/)", message.body)
    assert match, message.body
    return match.group(1)


def _invite(team, capture, email="new@example.com", role="developer") -> str:
    owner = signed_in(team["users"]["owner"])
    with capture(execute=True):  # the mail goes out on commit
        assert owner.post("/dashboard/members/", {"email": email, "role": role}).status_code == 302
    assert mail.outbox[-1].to == [email] and "Owner Co" in mail.outbox[-1].subject
    return _link(mail.outbox[-1])


def test_an_invitation_sets_a_password_joins_with_its_role_and_signs_in(team, django_capture_on_commit_callbacks):
    link = _invite(team, django_capture_on_commit_callbacks)
    invitation = Invitation.objects.get(email="new@example.com")
    # The email holds the link; the database only a digest of its nonce.
    assert invitation.nonce_digest not in link and link.split("/")[-2] not in invitation.nonce_digest
    guest = Client()
    page = guest.get(link)
    assert page.status_code == 200 and "Join Owner Co" in page.content.decode()
    assert guest.post(link, {"password": "short"}).status_code == 400  # Django's password validators
    response = guest.post(link, {"password": PASSWORD})
    assert response.status_code == 302 and response["Location"] == "/dashboard/"
    assert guest.get("/dashboard/keys/").status_code == 200  # developer: keys
    assert guest.get("/dashboard/members/").status_code == 403
    membership = Membership.objects.get(user__username="new@example.com")
    assert (membership.account, membership.role) == (team["account"], "developer")
    assert Client().login(username="new@example.com", password=PASSWORD)
    assert AuditLog.objects.filter(action="member.invite", actor="owner@example.com").count() == 1
    assert AuditLog.objects.get(action="member.add", detail__via="invitation").detail["role"] == "developer"


def test_an_invitation_link_works_once(team, django_capture_on_commit_callbacks):
    link = _invite(team, django_capture_on_commit_callbacks)
    assert Client().post(link, {"password": PASSWORD}).status_code == 302
    again = Client().post(link, {"password": "another " + PASSWORD})
    assert again.status_code == 410 and "already been used" in again.content.decode()
    assert Client().get(link).status_code == 410
    user = get_user_model().objects.get(username="new@example.com")
    assert user.check_password(PASSWORD)


def test_an_expired_withdrawn_or_forged_link_is_refused(team, django_capture_on_commit_callbacks):
    link = _invite(team, django_capture_on_commit_callbacks)
    Invitation.objects.filter(email="new@example.com").update(expires_at=timezone.now())
    expired = Client().post(link, {"password": PASSWORD})
    assert expired.status_code == 410 and "expired" in expired.content.decode()
    assert not get_user_model().objects.filter(username="new@example.com").exists()
    forged = link[:-3] + ("A" if link[-3] != "A" else "B") + link[-2:]
    assert Client().get(forged).status_code == 410
    link2 = _invite(team, django_capture_on_commit_callbacks, email="other@example.com")
    invitation = Invitation.objects.get(email="other@example.com")
    signed_in(team["users"]["owner"]).post(f"/dashboard/members/invitations/{invitation.pk}/revoke/")
    assert "withdrawn" in Client().get(link2).content.decode()


def test_the_signature_expiry_holds_without_the_row(team, django_capture_on_commit_callbacks, monkeypatch):
    link = _invite(team, django_capture_on_commit_callbacks)
    import time

    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 8 * 24 * 3600)
    assert "expired" in Client().get(link).content.decode()


def test_an_existing_login_accepts_with_its_own_password(team, django_capture_on_commit_callbacks):
    get_user_model().objects.create_user(username="known@example.com", email="known@example.com", password=PASSWORD)
    link = _invite(team, django_capture_on_commit_callbacks, email="known@example.com", role="viewer")
    page = Client().post(link, {"password": "not it at all"})
    assert page.status_code == 400 and not Membership.objects.filter(user__username="known@example.com").exists()
    assert Client().post(link, {"password": PASSWORD}).status_code == 302
    assert Membership.objects.get(user__username="known@example.com").role == "viewer"


def test_inviting_a_member_is_refused_on_the_form(team):
    owner = signed_in(team["users"]["owner"])
    page = owner.post("/dashboard/members/", {"email": "out@example.com", "role": "viewer"})
    assert page.status_code == 400 and "member of another account" in page.content.decode()
    assert owner.post("/dashboard/members/", {"email": "nope", "role": "viewer"}).status_code == 400
    assert owner.post("/dashboard/members/", {"email": "a@example.com", "role": "root"}).status_code == 400
    assert len(mail.outbox) == 0


# The commands


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_addmember_creates_a_login_with_the_role_and_prints_the_email(monkeypatch):
    account = make_account(name="acme")
    monkeypatch.setenv("SPEEDINFER_PASSWORD", PASSWORD)
    out = run("addmember", "acme", "Dev@Acme.test", "--role", "developer")
    assert out.strip().splitlines()[-1] == "dev@acme.test"
    membership = Membership.objects.get(user__username="dev@acme.test")
    assert (membership.account, membership.role) == (account, "developer")
    assert Client().login(username="dev@acme.test", password=PASSWORD)
    # Again with another role (by id): the role changes, the password is kept.
    monkeypatch.setenv("SPEEDINFER_PASSWORD", "something else entirely")
    out = run("addmember", str(account.pk), "dev@acme.test", "--role", "viewer")
    assert "from developer to viewer" in out and out.strip().splitlines()[-1] == "dev@acme.test"
    membership.refresh_from_db()
    assert membership.role == "viewer" and membership.user.check_password(PASSWORD)
    actions = list(AuditLog.objects.filter(actor="manage.py addmember").values_list("action", flat=True))
    assert sorted(actions) == ["member.add", "member.role"]


def test_the_first_login_of_createaccount_is_an_owner(monkeypatch):
    monkeypatch.setenv("SPEEDINFER_PASSWORD", PASSWORD)
    run("createaccount", "acme", "--owner", "boss@acme.test")
    assert Membership.objects.get(user__username="boss@acme.test").role == "owner"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("nobody", "a@acme.test", "--role", "viewer"), "account: no account 'nobody'"),
        (("acme", "a@acme.test", "--role", "root"), "role: unknown role 'root'"),
        (("acme", "not-an-email", "--role", "viewer"), "email: not an email address"),
        (("acme", "out@other.test", "--role", "viewer"), "email: out@other.test is a member of another account"),
        (("acme", "boss@acme.test", "--role", "viewer"), "email: boss@acme.test is the account's last owner"),
    ],
)
def test_addmember_refuses_bad_input_naming_the_field(monkeypatch, args, message):
    account = make_account(name="acme")
    monkeypatch.setenv("SPEEDINFER_PASSWORD", PASSWORD)
    account_user_create(account=account, email="boss@acme.test", password=PASSWORD)
    account_user_create(account=make_account(name="other"), email="out@other.test", password=PASSWORD)
    with pytest.raises(CommandError, match=re.escape(message)):
        run("addmember", *args)


def test_addmember_without_a_password_and_no_terminal_says_so(monkeypatch):
    make_account(name="acme")
    monkeypatch.delenv("SPEEDINFER_PASSWORD", raising=False)
    with pytest.raises(CommandError, match="password: set SPEEDINFER_PASSWORD"):
        run("addmember", "acme", "a@acme.test", "--role", "viewer")


def test_removemember_ends_the_sessions_at_once(monkeypatch):
    account = make_account(name="acme")
    account_user_create(account=account, email="boss@acme.test", password=PASSWORD)
    dev = make_member(account=account, email="dev@acme.test", role="developer").membership.user
    client = signed_in(dev)
    assert client.get("/dashboard/keys/").status_code == 200
    out = run("removemember", "acme", "DEV@acme.test")
    assert "Removed dev@acme.test" in out
    assert client.get("/dashboard/keys/").status_code in (302, 403)
    assert not Membership.objects.filter(user=dev).exists()
    assert AuditLog.objects.get(action="member.remove").actor == "manage.py removemember"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("nobody", "boss@acme.test"), "account: no account 'nobody'"),
        (("acme", "ghost@acme.test"), "email: 'ghost@acme.test' is not a member of 'acme'"),
        (("acme", "boss@acme.test"), "email: boss@acme.test is the account's last owner"),
    ],
)
def test_removemember_refuses_bad_input_naming_the_field(args, message):
    account = make_account(name="acme")
    account_user_create(account=account, email="boss@acme.test", password=PASSWORD)
    with pytest.raises(CommandError, match=re.escape(message)):
        run("removemember", *args)
    assert Membership.objects.filter(user__username="boss@acme.test").exists()


def test_commands_exit_1_with_one_line_and_have_help(subprocess_env):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for name in ("addmember", "removemember"):
        helped = subprocess.run(
            [sys.executable, "manage.py", name, "--help"], cwd=root, env=subprocess_env, capture_output=True, text=True
        )
        assert helped.returncode == 0 and "account id or name" in helped.stdout
    bad = subprocess.run(
        [sys.executable, "manage.py", "addmember", "nobody", "a@b.test", "--role", "viewer"],
        cwd=root,
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 1 and bad.stderr.strip() == "CommandError: account: no account 'nobody'"


# The admin


def test_the_admin_manages_members_through_the_inline_with_audit(team, admin_client):
    account = team["account"]
    viewer = team["users"]["viewer"].membership
    members = list(Membership.objects.filter(account=account).order_by("pk"))
    data = {
        "rpm_ceiling": "",
        "tpm_ceiling": "",
        "memberships-TOTAL_FORMS": str(len(members)),
        "memberships-INITIAL_FORMS": str(len(members)),
    }
    for i, m in enumerate(members):
        data |= {
            f"memberships-{i}-id": str(m.pk),
            f"memberships-{i}-account": str(account.pk),
            f"memberships-{i}-user": str(m.user_id),
            f"memberships-{i}-role": "developer" if m.pk == viewer.pk else m.role,
        }
    response = admin_client.post(f"/admin/accounts/account/{account.pk}/change/", data)
    assert response.status_code == 302, response.content.decode()[:2000]
    assert Membership.objects.get(pk=viewer.pk).role == "developer"
    assert AuditLog.objects.get(action="member.role", detail__via="admin").detail["email"] == "viewer@example.com"
    page = admin_client.get("/admin/accounts/invitation/")
    assert page.status_code == 200 and "later@example.com" in page.content.decode()


@pytest.mark.django_db(transaction=True)
def test_a_removed_member_open_live_feed_is_closed():
    import asyncio
    import uuid

    from asgiref.sync import async_to_sync
    from channels.db import database_sync_to_async
    from channels.testing import WebsocketCommunicator

    from accounts.services import member_remove
    from billing.services import credits_reserve, reservation_settle
    from core.outcome import RequestOutcome
    from speedinfer.asgi import application

    model = make_model(model_id="acme/live-team")
    account = make_account(name=f"live-team-{uuid.uuid4().hex[:6]}", credits=10)
    account_user_create(account=account, email="boss@live-team.example", password=PASSWORD)
    member = make_member(account=account, email="dev@live-team.example", role="developer", password=PASSWORD)
    client = Client()
    assert client.login(username="dev@live-team.example", password=PASSWORD)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()

    def settle(request_id: str) -> None:
        reservation = credits_reserve(account_id=account.pk, amount=MICRO, model=model, request_id=request_id)
        reservation_settle(
            reservation_id=reservation.pk,
            prompt_tokens=10,
            completion_tokens=5,
            outcome=RequestOutcome(request_id="", worker_id="w1", latency=0.01),
        )

    async def scenario() -> None:
        socket = WebsocketCommunicator(application, "/ws/usage/", headers=[(b"cookie", cookie)])
        assert (await socket.connect())[0]
        await database_sync_to_async(member_remove)(membership=member.membership, actor="test")
        await asyncio.sleep(1.1)  # past the once-a-second membership re-read
        await database_sync_to_async(settle)(f"gone-{uuid.uuid4().hex}")
        closed = await socket.receive_output(timeout=5)
        assert closed == {"type": "websocket.close", "code": 4403}

    async_to_sync(scenario)()


def test_owner_emails_names_only_the_owners(team):
    from accounts.selectors import owner_emails

    make_member(account=team["account"], email="second-owner@example.com", role="owner")
    assert owner_emails(account=team["account"]) == ["owner@example.com", "second-owner@example.com"]
