"""What `make run` promises, end to end with real processes: bootstrap, a node agent that
registers 4 simulated GPUs, and daphne serving the admin and the token-authenticated API."""

import http.cookiejar
import json
import re
import urllib.parse
import urllib.request
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django_q.models import Schedule

from tenants.models import ApiToken
from tests.live import manage, web_server


def bootstrap() -> dict[str, str]:
    out = StringIO()
    call_command("bootstrap", stdout=out)
    text = out.getvalue()
    return {
        "admin_password": re.search(r"operator\s+admin / (\S+)", text).group(1),
        "token": re.search(r"API token (gpup_\S+)", text).group(1),
    }


@pytest.mark.django_db(transaction=True)
def test_an_operator_sees_four_simulated_gpus_and_the_token_works():
    secrets = bootstrap()
    agent = manage("node_agent", "--once", "--backend", "simulated")
    assert agent.returncode == 0, agent.stderr
    assert "registered 4 GPU(s) via simulated" in agent.stdout

    with web_server() as base:
        jar = http.cookiejar.CookieJar()
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        login_page = browser.open(f"{base}/admin/login/").read().decode()
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login_page).group(1)
        form = urllib.parse.urlencode(
            {
                "csrfmiddlewaretoken": csrf,
                "username": "admin",
                "password": secrets["admin_password"],
                "next": "/admin/",
            }
        ).encode()
        request = urllib.request.Request(
            f"{base}/admin/login/", data=form, headers={"Referer": f"{base}/admin/login/"}
        )
        assert browser.open(request).geturl() == f"{base}/admin/"
        gpu_page = browser.open(f"{base}/admin/scheduling/gpu/").read().decode()
        assert "4 GPUs" in gpu_page
        for index in range(4):
            assert f"workstation-1/gpu{index}" in gpu_page

        api = urllib.request.Request(
            f"{base}/api/v1/me/", headers={"Authorization": f"Bearer {secrets['token']}"}
        )
        me = json.loads(urllib.request.urlopen(api).read())
        assert (me["username"], me["tenant"]) == ("alice", "demo")

        anonymous = urllib.request.Request(f"{base}/api/v1/me/")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(anonymous)
        assert refused.value.code == 401


@pytest.mark.django_db
def test_bootstrap_shows_secrets_once_and_changes_nothing_the_second_time():
    bootstrap()
    second = StringIO()
    call_command("bootstrap", stdout=second)
    assert second.getvalue() == ""
    assert User.objects.count() == 2
    assert ApiToken.objects.count() == 1
    assert Schedule.objects.filter(func="scheduling.tasks.mark_silent_nodes").count() == 1
