from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from accounts.keys import KEY_PREFIX
from accounts.models import ApiKey
from accounts.selectors import api_key_authenticate
from accounts.services import api_key_revoke, api_key_touch
from tests.factories import make_account, make_key, make_model

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


def test_it_stores_only_a_digest_and_authenticates_the_secret():
    created = make_key(account=make_account(), name="ci")
    assert created.secret.startswith(KEY_PREFIX)
    row = ApiKey.objects.get(pk=created.api_key.pk)
    assert created.secret not in (row.digest, row.lookup_id, row.name)
    assert len(row.digest) == 64
    result = api_key_authenticate(raw_key=created.secret)
    assert result.key is not None and result.key.id == row.pk
    assert result.key.scopes == {"chat", "completions", "embeddings", "models", "usage"}


def test_it_rejects_a_wrong_secret_with_the_right_lookup_id():
    created = make_key(account=make_account())
    forged = created.secret[:-4] + ("AAAA" if not created.secret.endswith("AAAA") else "BBBB")
    assert api_key_authenticate(raw_key=forged).reason == "unknown"
    assert api_key_authenticate(raw_key="sk-si-nope").reason == "unknown"
    assert api_key_authenticate(raw_key="").reason == "missing"


def test_it_costs_one_query_cold_and_none_warm(django_assert_num_queries):
    created = make_key(account=make_account())
    with django_assert_num_queries(1):
        assert api_key_authenticate(raw_key=created.secret).key is not None
    with django_assert_num_queries(0):
        assert api_key_authenticate(raw_key=created.secret).key is not None


def test_revocation_applies_at_once_in_this_process():
    created = make_key(account=make_account())
    assert api_key_authenticate(raw_key=created.secret).key is not None
    api_key_revoke(api_key=created.api_key)
    assert api_key_authenticate(raw_key=created.secret).reason == "revoked"


def test_revocation_elsewhere_applies_within_the_cache_ttl(settings):
    settings.SPEEDINFER_KEY_CACHE_TTL = 0
    created = make_key(account=make_account())
    assert api_key_authenticate(raw_key=created.secret).key is not None
    # Another process revokes: only the database changes, not this cache.
    ApiKey.objects.filter(pk=created.api_key.pk).update(revoked_at=timezone.now())
    assert api_key_authenticate(raw_key=created.secret).reason == "revoked"


def test_an_expired_key_is_refused():
    created = make_key(account=make_account(), expires_at=timezone.now() + timedelta(seconds=30))
    ApiKey.objects.filter(pk=created.api_key.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert api_key_authenticate(raw_key=created.secret).reason == "expired"


def test_it_validates_scopes_models_and_limits():
    account = make_account()
    with pytest.raises(ValidationError, match="unknown scope"):
        make_key(account=account, scopes=["chat", "root"])
    with pytest.raises(ValidationError, match="unknown model"):
        make_key(account=account, allowed_models=["nope/model"])
    with pytest.raises(ValidationError):
        make_key(account=account, rpm=0)
    make_model(model_id="acme/model-1")
    key = make_key(account=account, allowed_models=["acme/model-1"], rpm=10, tpm=1000).api_key
    assert key.allowed_models == ["acme/model-1"]


def test_last_used_is_written_at_most_once_a_minute(django_assert_num_queries):
    key = make_key(account=make_account()).api_key
    api_key_touch(key_id=key.pk)
    key.refresh_from_db()
    first = key.last_used_at
    assert first is not None
    api_key_touch(key_id=key.pk)
    key.refresh_from_db()
    assert key.last_used_at == first
