"""The $edgeHub manifest: JSON Schema validation with the bad field's JSON path, legacy and object routes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from appliance.forwarding.manifest import ManifestError, load_manifest, parse_manifest
from appliance.forwarding.routes import DEFAULT_PRIORITY

SPEC_EXAMPLE = {
    "$edgeHub": {
        "properties.desired": {
            "schemaVersion": "1.1.0",
            "routes": {
                "secCamAlerts": {
                    "route": "FROM /messages/modules/SecCamMod/outputs/P0_Alerts INTO $upstream", "priority": 0, "timeToLiveSecs": 86400
                },
                "floorCamAlerts": {
                    "route": "FROM /messages/modules/FloorCamMod/outputs/P0_Alerts INTO $upstream", "priority": 0, "timeToLiveSecs": 86400
                },
                "secCamData": {
                    "route": "FROM /messages/modules/SecCamMod/outputs/P1_Data INTO $upstream", "priority": 1, "timeToLiveSecs": 1800
                },
                "upstream": "FROM /messages/* INTO $upstream",
            },
            "storeAndForwardConfiguration": {"timeToLiveSecs": 7200},
        }
    }
}


def test_the_spec_example_loads() -> None:
    manifest = parse_manifest(SPEC_EXAMPLE)
    by_name = {r.name: r for r in manifest.routes}
    assert manifest.global_ttl_s == 7200
    assert (by_name["secCamData"].priority, by_name["secCamData"].ttl_s) == (1, 1800)
    assert (by_name["upstream"].priority, by_name["upstream"].ttl_s) == (DEFAULT_PRIORITY, 0)


def _desired(**routes: object) -> dict:
    return {"schemaVersion": "1.1.0", "routes": routes}


@pytest.mark.parametrize(
    ("document", "path"),
    [
        (_desired(r1={"route": "FROM /messages/* INTO $upstream", "priority": 10}), "$.routes.r1.priority"),
        (_desired(r1={"route": "FROM /messages/* INTO $upstream", "timeToLiveSecs": -1}), "$.routes.r1.timeToLiveSecs"),
        (_desired(r1={"priority": 1}), "$.routes.r1"),
        (_desired(r1={"route": "FROM /messages/* INTO $upstream", "priorty": 1}), "$.routes.r1"),
        (_desired(**{"bad.name": "FROM /messages/* INTO $upstream"}), "$.routes"),
        ({"routes": {}}, "$"),
        (
            {"schemaVersion": "1.1.0", "routes": {}, "storeAndForwardConfiguration": {"timeToLiveSecs": "1h"}},
            "$.storeAndForwardConfiguration.timeToLiveSecs",
        ),
        (_desired(r1={"route": "FROM /messages/* WHERE (a = 'b' INTO $upstream"}), "$.routes.r1.route"),
        (_desired(r1="FROM /messages/* INTO $cloud"), "$.routes.r1"),
        (
            {"$edgeHub": {"properties.desired": _desired(r1={"route": "x", "priority": "high"})}},
            "$.$edgeHub.properties.desired.routes.r1.priority",
        ),
    ],
)
def test_bad_manifests_name_the_json_path(document: dict, path: str) -> None:
    with pytest.raises(ManifestError) as info:
        parse_manifest(document)
    assert info.value.path == path, info.value


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.1.0", "1.2", "1.2.0", "1.3", "1.3.0.0"])
def test_every_schema_version_edge_hub_reads_is_accepted(version: str) -> None:
    """EdgeHubConfigParser: System.Version, major 1, minor 0 to 3 (Azure/iotedge's samples use 1.2, with a
    mqttBroker section next to the routes)."""
    document = {"schemaVersion": version, "routes": {"r": "FROM /messages/* INTO $upstream"},
                "mqttBroker": {"authorizations": []}}
    assert [r.name for r in parse_manifest(document).routes] == ["r"]


@pytest.mark.parametrize("version", ["2.0", "1.4", "1", "1.2.x", " 1.2", "1.2.0.0.0", ""])
def test_other_schema_versions_are_refused(version: str) -> None:
    with pytest.raises(ManifestError) as info:
        parse_manifest({"schemaVersion": version, "routes": {}})
    assert info.value.path == "$.schemaVersion"


def test_route_errors_carry_the_column(tmp_path: Path) -> None:
    file = tmp_path / "m.json"
    file.write_text(json.dumps(_desired(r1="FROM /messages/* WHERE key1 = INTO $upstream")))
    with pytest.raises(ManifestError, match="column 31"):
        load_manifest(file)


def test_invalid_json_reports_line_and_column(tmp_path: Path) -> None:
    file = tmp_path / "m.json"
    file.write_text('{"schemaVersion": "1.1.0",\n "routes": {,}}')
    with pytest.raises(ManifestError, match="line 2 column"):
        load_manifest(file)


def test_a_whole_deployment_file_is_read_for_its_edgehub_section(tmp_path: Path) -> None:
    """As ``iotedge``'s deployment.json has it: $edgeAgent and the modules next to $edgeHub."""
    deployment = {"modulesContent": {
        "$edgeAgent": {"properties.desired": {"schemaVersion": "1.1", "modules": {"SecCamMod": {"type": "docker"}}}},
        **SPEC_EXAMPLE,
        "SecCamMod": {"properties.desired": {"interval": 5}},
    }}
    path = tmp_path / "deployment.json"
    path.write_text(json.dumps(deployment))
    manifest = load_manifest(path)
    assert {r.name for r in manifest.routes} == {"secCamAlerts", "floorCamAlerts", "secCamData", "upstream"}
    assert manifest.global_ttl_s == 7200

    bad = json.loads(json.dumps(deployment))
    bad["modulesContent"]["$edgeHub"]["properties.desired"]["routes"]["secCamData"]["priority"] = 12
    with pytest.raises(ManifestError) as error:
        parse_manifest(bad)
    assert error.value.path == "$.modulesContent.$edgeHub.properties.desired.routes.secCamData.priority"


def test_a_deployment_file_without_edgehub_says_where_the_section_belongs() -> None:
    with pytest.raises(ManifestError, match=r"the \$edgeHub section is at modulesContent.\$edgeHub.properties.desired"):
        parse_manifest({"modulesContent": {"$edgeAgent": {"properties.desired": {}}}})
