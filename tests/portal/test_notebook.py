"""The submit page's Notebook choice: JupyterLab as a service task of the tenant, under the
gateway's path for it, opened as soon as it is submitted."""

from __future__ import annotations

import pytest

from scheduling.models import Task
from scheduling.spec import SpecError, parse_specs
from tests.portal.conftest import browser


def _services_supported() -> bool:
    try:
        parse_specs({"kind": "task", "name": "s", "command": "s", "service": {"port": "auto"}})
    except SpecError:
        return False
    return True


def test_the_submit_page_offers_a_notebook(teammate):
    page = browser(teammate).get("/portal/submit/?mode=notebook").content.decode()
    assert 'id="notebook-form"' in page
    assert 'name="notebook-python" value="python3"' in page
    chinese = browser(teammate, "zh-hans").get("/portal/submit/?mode=notebook").content.decode()
    assert "启动笔记本" in chinese


def test_an_interpreter_that_is_not_a_plain_path_is_refused_by_name(teammate, workstation):
    form = {"mode": "notebook", "notebook-name": "nb", "notebook-python": "python3; rm -rf ~",
            "notebook-gpus": "1"}  # fmt: skip
    response = browser(teammate).post("/portal/submit/", form)
    assert response.status_code == 400
    assert "A command name or path" in response.content.decode()
    assert not Task.objects.exists()


@pytest.mark.skipif(
    not _services_supported(), reason="the spec has no service block yet (issue 43, item 1)"
)
def test_a_notebook_is_submitted_as_a_service_and_opened(teammate, workstation):
    form = {"mode": "notebook", "notebook-name": "nb", "notebook-python": "envs/lab/bin/python",
            "notebook-gpus": "1", "notebook-timeout": "8h"}  # fmt: skip
    response = browser(teammate).post("/portal/submit/", form)
    task = Task.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/services/{task.pk}/"
    assert task.task_class == "online"
    assert "envs/lab/bin/python -m jupyterlab" in task.command
    assert '--ServerApp.base_url="/services/$GPUPLATFORM_TASK_ID/"' in task.command
    assert "--ServerApp.token=''" in task.command
    assert '--port "$PORT"' in task.command
