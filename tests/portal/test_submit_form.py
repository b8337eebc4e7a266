"""The submit page knows the estate: GPU type and pool are choices from the inventory, each
with what is free now and (for those who may see the quota) how many more GPUs the quota
allows; a clone keeps a type or pool that is gone; the YAML editor opens with an example that
parses and links to the spec reference; /favicon.ico answers."""

from __future__ import annotations

from scheduling.models import GPU, GpuState, Task
from scheduling.spec import parse_yaml
from tests.factories import (
    AllocationFactory,
    NodeFactory,
    PoolFactory,
    QuotaFactory,
    TaskFactory,
    make_gpus,
)
from tests.portal.conftest import browser


def _choices(response, field: str) -> dict[str, str]:
    choices = response.context["form"].fields[field].choices
    return {str(value): str(label) for value, label in choices}


def _estate(tenant):
    """The workstation's 4 x rtx4090-24g in pool default (one held whole, one shared by half,
    one draining, one free) and 2 x a100-80g in pool training; quotas of 3 GPUs over all and 1
    in training."""
    rtx = make_gpus(NodeFactory(name="workstation-1"), count=4)
    big = NodeFactory(name="big-1", pool=PoolFactory(name="training"))
    for index in range(2):
        GPU.objects.create(node=big, index=index, uuid=f"GPU-a100-{index}", model="A100",
                           gpu_type="a100-80g", memory_mb=81920)  # fmt: skip
    whole = TaskFactory(tenant=tenant, state="running")
    AllocationFactory(task=whole, gpu=rtx[0], exclusive=True, memory_mb=24576)
    half = TaskFactory(tenant=tenant, state="running")
    AllocationFactory(task=half, gpu=rtx[1], memory_mb=12288)
    GPU.objects.filter(pk=rtx[3].pk).update(state=GpuState.DRAINING)
    QuotaFactory(tenant=tenant, max_gpus=3)
    QuotaFactory(tenant=tenant, pool=big.pool, max_gpus=1)


def test_the_type_and_pool_choices_say_what_is_free_and_what_the_quota_allows(owner):
    _estate(owner.tenant)
    response = browser(owner).get("/portal/submit/")
    assert _choices(response, "gpu_type") == {
        "": "any type: 3 of 6 free; your quota allows 1.5 more",
        "a100-80g": "a100-80g: 2 of 2 free; your quota allows 1.5 more",
        "rtx4090-24g": "rtx4090-24g: 1 of 4 free; your quota allows 1.5 more",
    }
    assert _choices(response, "pool") == {
        "": "any pool: 3 of 6 free; your quota allows 1.5 more",
        "default": "default: 1 of 4 free; your quota allows 1.5 more",
        "training": "training: 2 of 2 free; your quota allows 1 more",
    }
    html = response.content.decode()
    assert '<option value="a100-80g">a100-80g: 2 of 2 free; your quota allows 1.5 more' in html
    chinese = browser(owner, language="zh-hans").get("/portal/submit/")
    assert _choices(chinese, "pool")["training"] == "training：2 块空闲（共 2 块）；配额还允许 1 块"


def test_members_see_what_is_free_but_not_the_quota_which_only_admins_see(teammate):
    _estate(teammate.tenant)
    choices = _choices(browser(teammate).get("/portal/submit/"), "gpu_type")
    assert choices["rtx4090-24g"] == "rtx4090-24g: 1 of 4 free"
    assert not any("quota" in label for label in choices.values())


def test_no_quota_says_so(owner, workstation):
    choices = _choices(browser(owner).get("/portal/submit/"), "gpu_type")
    assert choices == {
        "": "any type: 4 of 4 free; no quota limit",
        "rtx4090-24g": "rtx4090-24g: 4 of 4 free; no quota limit",
    }


def test_a_pool_of_cpu_only_nodes_is_offered_too(teammate, workstation):
    NodeFactory(name="cpu-1", pool=PoolFactory(name="cpu"))
    choices = _choices(browser(teammate).get("/portal/submit/"), "pool")
    assert choices == {
        "": "any pool: 4 of 4 free",
        "cpu": "cpu: 0 of 0 free",
        "default": "default: 4 of 4 free",
    }


def test_the_form_submits_the_chosen_type_and_pool(teammate, workstation):
    form = {"mode": "form", "task-name": "train", "task-command": "python train.py",
            "task-gpus": "1", "task-priority": "normal", "task-task_class": "batch",
            "task-gpu_type": "rtx4090-24g", "task-pool": "default"}  # fmt: skip
    response = browser(teammate).post("/portal/submit/", form)
    task = Task.objects.get()
    assert response.status_code == 302, response.context["form"].errors
    assert (task.gpu_type, task.spec["resources"]["pool"]) == ("rtx4090-24g", "default")


def test_a_clone_keeps_a_type_and_pool_that_are_gone_and_submitting_it_names_the_field(
    teammate, workstation
):
    spec = {"kind": "task", "name": "old", "command": "python train.py",
            "resources": {"gpus": 1, "gpu_type": "h100-80g", "pool": "gone"}}  # fmt: skip
    task = TaskFactory(tenant=teammate.tenant, owner=teammate.user, name="old",
                       gpu_type="h100-80g", spec=spec)  # fmt: skip
    client = browser(teammate)
    response = client.get(f"/portal/submit/?clone={task.pk}")
    html = response.content.decode()
    assert '<option value="h100-80g" selected>h100-80g: not in the inventory now</option>' in html
    assert '<option value="gone" selected>gone: not in the inventory now</option>' in html
    form = {"mode": "form", "task-name": "old", "task-command": "python train.py",
            "task-gpus": "1", "task-priority": "normal", "task-task_class": "batch",
            "task-gpu_type": "h100-80g"}  # fmt: skip
    refused = client.post(f"/portal/submit/?clone={task.pk}", form)
    assert refused.status_code == 400
    assert "no GPU of type 'h100-80g'" in " ".join(refused.context["form"].errors["gpu_type"])
    assert 'value="h100-80g" selected' in refused.content.decode()
    assert Task.objects.count() == 1


def test_a_posted_type_longer_than_the_schema_allows_is_refused_beside_the_field(
    teammate, workstation
):
    form = {"mode": "form", "task-name": "t", "task-command": "true", "task-gpus": "1",
            "task-priority": "normal", "task-task_class": "batch",
            "task-gpu_type": "x" * 500}  # fmt: skip
    response = browser(teammate).post("/portal/submit/", form)
    assert response.status_code == 400
    assert "gpu_type" in response.context["form"].errors
    assert Task.objects.count() == 0


def _example(response) -> str:
    return response.context["yaml_form"]["spec"].value()


def test_the_yaml_editor_opens_with_an_example_that_parses_and_links_the_reference(
    teammate, workstation
):
    client = browser(teammate)
    response = client.get("/portal/submit/?mode=yaml")
    example = _example(response)
    for key in ("name:", "command:", "gpus:", "gpu_memory:", "queue:", "timeout:", "# kind: sweep"):
        assert key in example
    assert [spec.name for spec in parse_yaml(example)] == ["my-training"]
    # The sweep below it, uncommented, adds a second document of two tasks.
    task, sweep = example.split("# ---\n")
    sweep = "\n".join(line.removeprefix("# ") for line in sweep.splitlines())
    assert len(parse_yaml(f"{task}---\n{sweep}")) == 3
    assert 'href="/portal/spec/"' in response.content.decode()
    reference = client.get("/portal/spec/")
    assert reference.status_code == 200
    assert "<code>resources.gpu_memory</code>" in reference.content.decode()
    chinese = _example(browser(teammate, language="zh-hans").get("/portal/submit/?mode=yaml"))
    assert "每张卡" in chinese and len(parse_yaml(chinese)) == 1


def test_a_clone_opens_the_editor_with_its_own_spec_not_the_example(teammate, workstation):
    task = TaskFactory(tenant=teammate.tenant, owner=teammate.user, name="orig",
                       spec={"name": "orig", "command": "true"})  # fmt: skip
    example = _example(browser(teammate).get(f"/portal/submit/?clone={task.pk}&mode=yaml"))
    assert example.startswith("name: orig") and "my-training" not in example


def test_the_spec_reference_needs_a_sign_in(outsider):
    assert browser().get("/portal/spec/").status_code == 302
    assert browser(outsider).get("/portal/spec/").status_code == 200  # the schema is public


def test_every_page_links_the_icon_and_favicon_ico_answers(teammate):
    icon_link = '<link rel="icon" href="/static/favicon.svg"'
    anonymous = browser()
    assert icon_link in browser(teammate).get("/portal/").content.decode()
    assert icon_link in anonymous.get("/admin/login/").content.decode()
    assert icon_link in anonymous.get("/accounts/login/").content.decode()
    redirect = anonymous.get("/favicon.ico")
    assert redirect.status_code == 302 and redirect["Location"] == "/static/favicon.svg"
    icon = anonymous.get("/static/favicon.svg")
    assert icon.status_code == 200 and b"<svg" in b"".join(icon.streaming_content)


SERVICE_FORM = {"mode": "form", "task-name": "llm", "task-command": "serve --port $PORT",
                "task-gpus": "1", "task-priority": "normal",
                "task-task_class": "batch"}  # fmt: skip


def test_the_form_s_service_section_submits_a_service_with_its_replicas(teammate, workstation):
    client = browser(teammate)
    page = client.get("/portal/submit/?mode=form").content.decode()
    assert 'id="service-fields"' in page and 'name="task-service_port"' in page
    form = {**SERVICE_FORM, "task-service_port": "auto", "task-health_path": "/health",
            "task-health_start_period": "10m", "task-replicas": "2"}  # fmt: skip
    response = client.post("/portal/submit/", form)
    assert response.status_code == 302, response.context["form"].errors
    service, replica = Task.objects.order_by("id")
    assert replica.replica_of_id == service.pk
    assert service.task_class == "online" and not service.preemptible
    assert service.spec["service"]["health"]["start_period"] == 600
    clone = client.get(f"/portal/submit/?mode=form&clone={service.pk}")
    initial = clone.context["form"].initial
    assert (initial["service_port"], initial["health_path"], initial["replicas"]) == (
        "auto",
        "/health",
        "2",
    )


def test_a_bad_service_value_is_refused_beside_its_field(teammate, workstation):
    form = {**SERVICE_FORM, "task-service_port": "80", "task-replicas": "99"}
    response = browser(teammate).post("/portal/submit/", form)
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert "1024 to 65535" in " ".join(errors["service_port"])
    assert "from 1 to 16" in " ".join(errors["replicas"])
    assert Task.objects.count() == 0
