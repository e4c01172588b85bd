// Standalone harness: load an NCCL topology XML with NCCL's own parser
// (ncclTopoGetXmlFromFile, src/graph/xml.cc), print the parsed tree, then
// (optionally) build the ncclTopoSystem with ncclTopoGetSystemFromXml
// (src/graph/topo.cc).  All parsing/building code is NCCL's, unmodified.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "xml.h"
#include "topo.h"
#include "utils.h"
#include "nvmlwrap.h"

extern "C" int harnessWarnCount;  // defined in stubs.cc

static void printTree(struct ncclXmlNode* n, int depth) {
  printf("%*s<%s", depth * 2, "", n->name);
  for (int a = 0; a < n->nAttrs; a++) printf(" %s=\"%s\"", n->attrs[a].key, n->attrs[a].value);
  if (n->nSubs == 0) {
    printf("/>\n");
    return;
  }
  printf(">\n");
  for (int s = 0; s < n->nSubs; s++) printTree(n->subs[s], depth + 1);
  printf("%*s</%s>\n", depth * 2, "", n->name);
}

static const char* linkTypeStr(int t) {
  switch (t) {
  case LINK_LOC: return "LOC";
  case LINK_NVL: return "NVL";
  case LINK_C2C: return "C2C";
  case LINK_PCI: return "PCI";
  case LINK_SYS: return "SYS";
  case LINK_NET: return "NET";
  default: return "?";
  }
}

// Defined (non-static) in NCCL's xml.cc but not declared in a header.
ncclResult_t ncclTopoGetPciNode(struct ncclXml* xml, const char* busId, struct ncclXmlNode** pciNode);
ncclResult_t ncclTopoGetXmlFromSys(struct ncclXmlNode* pciNode, struct ncclXml* xml);
ncclResult_t ncclTopoGetXmlFromGpu(struct ncclXmlNode* pciNode, nvmlDevice_t nvmlDev, struct ncclXml* xml,
                                   struct ncclXmlNode** gpuNodeRet);

// --emulate: replay, with NCCL's own functions, what ncclTopoGetSystem (topo.cc) does on a single node where one
// rank owns each <gpu> of the file (document order), minus what needs a GPU/NVML/net plugin:
//   per rank: copy of the loaded XML; ncclTopoGetPciNode(busid as int64ToBusId prints it); class 0x03 if unset;
//             ncclTopoGetXmlFromSys (fills missing attrs of the GPU's pci node, its parents and its cpu, from this
//             machine's /sys and cpuid); ncclTopoGetXmlFromGpu with a NULL NVML handle; then keep/rank/gdr/mlopart.
//             every <net name=...>: ncclTopoFillNet + keep=1, dev=n, net=1 (ncclTopoPopulateNics; the plugin's
//             speed/latency/port/guid/maxconn/gdr are not invented).
//             ncclTopoTrimXml.
//   then the intra-node fusion of all ranks' XMLs (ncclTopoConvertXml + ncclTopoFuseXml), as in ncclTopoGetSystem.
static ncclResult_t emulateRanks(struct ncclXml** xmlPtr) {
  struct ncclXml* base = *xmlPtr;
  size_t sz = xmlMemSize(NCCL_TOPO_XML_MAX_NODES);
  // Collect GPU bus ids in document order.
  char busIds[64][NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
  int nRanks = 0;
  for (int i = 0; i < base->maxIndex && nRanks < 64; i++) {
    struct ncclXmlNode* x = base->nodes + i;
    if (strcmp(x->name, "gpu") != 0 || x->parent == NULL) continue;
    const char* b;
    NCCLCHECK(xmlGetAttr(x->parent, "busid", &b));
    if (b == NULL) {
      printf("emulate: <gpu> #%d has a parent without busid, skipped\n", nRanks);
      continue;
    }
    int64_t id;
    NCCLCHECK(busIdToInt64(b, &id));
    NCCLCHECK(int64ToBusId(id, busIds[nRanks]));  // what cudaDeviceGetPCIBusId->peerInfo.busId->int64ToBusId gives
    if (strcmp(busIds[nRanks], b) != 0)
      printf("emulate: NOTE file busid \"%s\" != the string NCCL looks up \"%s\" (xmlFindTagKv is an exact strcmp)\n",
             b, busIds[nRanks]);
    nRanks++;
  }
  printf("== --emulate: %d rank(s), one per <gpu> ==\n", nRanks);
  if (nRanks == 0) {
    printf("emulate: no <gpu> in the file: every NCCL rank's own GPU would be added by auto-detection instead; "
           "nothing to emulate\n");
    return ncclSuccess;
  }
  char* mem = (char*)calloc(nRanks, sz);
  for (int r = 0; r < nRanks; r++) {
    struct ncclXml* xml = (struct ncclXml*)(mem + sz * r);
    memcpy(xml, base, sz);
    ncclTopoConvertXml(xml, (uintptr_t)base->nodes, 1);  // re-point the copy's pointers into itself
    ncclTopoConvertXml(xml, (uintptr_t)xml->nodes, 0);
    printf("-- rank %d: GPU %s\n", r, busIds[r]);
    struct ncclXmlNode* node;
    // ncclTopoFillGpu without NVML:
    NCCLCHECK(ncclTopoGetPciNode(xml, busIds[r], &node));
    NCCLCHECK(xmlSetAttrIfUnset(node, "class", "0x03"));
    NCCLCHECK(ncclTopoGetXmlFromSys(node, xml));
    NCCLCHECK(ncclTopoGetXmlFromGpu(node, NULL, xml, &node));
    if (node) {
      NCCLCHECK(xmlSetAttrInt(node, "keep", 1));
      NCCLCHECK(xmlSetAttrInt(node, "rank", r));
      int idx;
      NCCLCHECK(xmlGetAttrIndex(node, "gdr", &idx));
      if (idx == -1) NCCLCHECK(xmlSetAttrInt(node, "gdr", 0));
      NCCLCHECK(xmlSetAttrInt(node, "mlopart", NCCL_TOPO_UNDEF));
    }
    int n = 0;
    for (int i = 0; i < xml->maxIndex; i++) {
      struct ncclXmlNode* x = xml->nodes + i;
      if (strcmp(x->name, "net") != 0 || x->type == NODE_TYPE_NONE) continue;
      const char* name;
      NCCLCHECK(xmlGetAttr(x, "name", &name));
      if (name == NULL) continue;
      struct ncclXmlNode* netNode;
      NCCLCHECK(ncclTopoFillNet(xml, "net", NULL, name, &netNode));
      NCCLCHECK(xmlSetAttrInt(netNode, "keep", 1));
      NCCLCHECK(xmlSetAttrInt(netNode, "dev", n++));
      NCCLCHECK(xmlSetAttrInt(netNode, "net", 1));
    }
    NCCLCHECK(ncclTopoTrimXml(xml));
    if (r == 0) {
      printf("== rank 0 XML after fill + trim ==\n");
      printTree(xml->nodes, 0);
    }
    NCCLCHECK(ncclTopoConvertXml(xml, (uintptr_t)xml->nodes, 1));
  }
  base->maxIndex = 0;
  for (int r = 0; r < nRanks; r++) {
    struct ncclXml* peer = (struct ncclXml*)(mem + sz * r);
    NCCLCHECK(ncclTopoConvertXml(peer, (uintptr_t)peer->nodes, 0));
    NCCLCHECK(ncclTopoFuseXml(base, peer));
  }
  free(mem);
  printf("== fused XML (%d nodes) ==\n", base->maxIndex);
  printTree(base->nodes, 0);
  return ncclSuccess;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s FILE.xml [--xml-only | --emulate]\n", argv[0]);
    return 2;
  }
  setvbuf(stdout, NULL, _IONBF, 0);  // keep stdout/stderr (NCCL log lines) in order
  const char* path = argv[1];
  bool xmlOnly = argc > 2 && strcmp(argv[2], "--xml-only") == 0;
  bool emulate = argc > 2 && strcmp(argv[2], "--emulate") == 0;

  // Same allocation NCCL does in ncclTopoGetSystem (topo.cc).
  struct ncclXml* xml;
  if (xmlAlloc(&xml, NCCL_TOPO_XML_MAX_NODES) != ncclSuccess) return 3;

  FILE* probe = fopen(path, "r");
  if (!probe) {
    // NCCL itself only INFOs and carries on with auto-detection in this case.
    perror(path);
    return 4;
  }
  fclose(probe);

  ncclResult_t res = ncclTopoGetXmlFromFile(path, xml, 1);
  if (res != ncclSuccess) {
    printf("RESULT: XML PARSE FAILED (ncclResult_t=%d: %s)\n", res, ncclGetErrorString(res));
    return 1;
  }
  printf("== Parsed XML tree (%d nodes) ==\n", xml->maxIndex);
  for (int i = 0; i < xml->maxIndex; i++)
    if (xml->nodes[i].parent == NULL) printTree(xml->nodes + i, 0);
  struct ncclXmlNode* sys;
  xmlFindTag(xml, "system", &sys);
  if (xml->maxIndex == 0 || sys == NULL) {
    printf("RESULT: XML parsed but no <system> element was loaded (NCCL would fall back to an empty topology)\n");
    return 1;
  }
  printf("RESULT: XML PARSE OK (%d nodes, %d warnings)\n", xml->maxIndex, harnessWarnCount);
  if (xmlOnly) return 0;

  // Next step NCCL performs (ncclTopoGetSystem, topo.cc): reset cpu host_hash,
  // then (after GPU/NIC detection + trim + fusion, which need CUDA/NVML/net
  // plugins and are skipped here) ncclTopoGetSystemFromXml.
  uint64_t hh = getHostHash();
  struct ncclXmlNode* node;
  xmlFindTag(xml, "cpu", &node);
  while (node != nullptr) {
    xmlSetAttrLong(node, "host_hash", hh);
    xmlFindNextTag(xml, "cpu", node, &node);
  }
  if (emulate) {
    res = emulateRanks(&xml);
    if (res != ncclSuccess) {
      printf("RESULT: emulated per-rank steps FAILED (ncclResult_t=%d: %s)\n", res, ncclGetErrorString(res));
      return 1;
    }
  }
  struct ncclTopoSystem* system = NULL;
  res = ncclTopoGetSystemFromXml(xml, &system, hh);
  if (res != ncclSuccess) {
    printf("RESULT: ncclTopoGetSystemFromXml FAILED (ncclResult_t=%d: %s)\n", res, ncclGetErrorString(res));
    return 1;
  }
  printf("== ncclTopoSystem built by ncclTopoGetSystemFromXml ==\n");
  printf("nHosts=%d maxBw=%g totalBw=%g\n", system->nHosts, system->maxBw, system->totalBw);
  for (int t = 0; t < NCCL_TOPO_NODE_TYPES; t++) {
    int c = system->nodes[t].count;
    if (c == 0) continue;
    printf("%s: %d\n", topoNodeTypeStr[t], c);
    for (int i = 0; i < c; i++) {
      struct ncclTopoNode* n = system->nodes[t].nodes + i;
      printf("  %s/%lx-%lx", topoNodeTypeStr[t], NCCL_TOPO_ID_SYSTEM_ID(n->id), NCCL_TOPO_ID_LOCAL_ID(n->id));
      switch (t) {
      case GPU:
        printf(" dev=%d rank=%d sm=%d gdr=%d", n->gpu.dev, n->gpu.rank, n->gpu.cudaCompCap, n->gpu.gdrSupport);
        break;
      case CPU:
        printf(" arch=%d vendor=%d model=%d affinity_cpus=%d", n->cpu.arch, n->cpu.vendor, n->cpu.model,
               ncclOsCpuCount(n->cpu.affinity));
        break;
      case PCI:
        printf(" device=0x%lx", n->pci.device);
        break;
      case NET:
      case GIN:
      case RMA:
        printf(" dev=%d bw=%g lat=%g port=%d gdr=%d coll=%d maxChannels=%d guid=0x%lx", n->net.dev, n->net.bw,
               n->net.latency, n->net.port, n->net.gdrSupport, n->net.collSupport, n->net.maxChannels, n->net.asic);
        break;
      }
      printf("\n");
      for (int l = 0; l < n->nlinks; l++) {
        struct ncclTopoLink* lk = n->links + l;
        printf("    --%s(%g)--> %s/%lx-%lx\n", linkTypeStr(lk->type), lk->bw, topoNodeTypeStr[lk->remNode->type],
               NCCL_TOPO_ID_SYSTEM_ID(lk->remNode->id), NCCL_TOPO_ID_LOCAL_ID(lk->remNode->id));
      }
    }
  }
  printf("== ncclTopoPrint ==\n");
  fflush(stdout);
  ncclTopoPrint(system);
  fflush(stderr);
  printf("RESULT: SYSTEM BUILD OK (%d warnings)\n", harnessWarnCount);
  return 0;
}
