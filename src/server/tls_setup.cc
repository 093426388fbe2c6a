// TLS contexts: pgrelay's server certificate (generated once if none is given) and the
// client context for upstream connections per sslmode.
#include "server/tls_setup.h"

#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>

namespace pgrelay::server {
namespace {

Error tls_error(const std::string& what) {
  unsigned long code = ERR_get_error();
  char buffer[256] = {0};
  if (code) ERR_error_string_n(code, buffer, sizeof buffer);
  return Error::make(sqlstate::kIoError, what + (code ? std::string(": ") + buffer : ""));
}

struct FileCloser {
  void operator()(FILE* f) const {
    if (f) std::fclose(f);
  }
};

}  // namespace

Status ensure_self_signed_certificate(const std::string& cert_path, const std::string& key_path,
                                      const std::string& common_name) {
  std::error_code ec;
  if (std::filesystem::exists(cert_path, ec) && std::filesystem::exists(key_path, ec)) return {};
  std::filesystem::create_directories(std::filesystem::path(cert_path).parent_path(), ec);

  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(EVP_EC_gen("P-256"), &EVP_PKEY_free);
  if (!key) return tls_error("could not generate a TLS key");
  std::unique_ptr<X509, decltype(&X509_free)> cert(X509_new(), &X509_free);
  if (!cert) return tls_error("could not create a certificate");
  X509_set_version(cert.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), static_cast<long>(std::time(nullptr)));
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 10L * 365 * 24 * 3600);
  X509_set_pubkey(cert.get(), key.get());
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(common_name.c_str()), -1, -1,
                             0);
  X509_set_issuer_name(cert.get(), name);
  if (!X509_sign(cert.get(), key.get(), EVP_sha256())) {
    return tls_error("could not sign the certificate");
  }

  // The key is written with mode 0600 from the start, never readable by others.
  int fd = ::open(key_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return Error::make(sqlstate::kIoError, "could not create " + key_path);
  std::unique_ptr<FILE, FileCloser> key_file(fdopen(fd, "w"));
  if (!key_file ||
      !PEM_write_PrivateKey(key_file.get(), key.get(), nullptr, nullptr, 0, nullptr, nullptr)) {
    return tls_error("could not write " + key_path);
  }
  std::unique_ptr<FILE, FileCloser> cert_file(std::fopen(cert_path.c_str(), "w"));
  if (!cert_file || !PEM_write_X509(cert_file.get(), cert.get())) {
    return tls_error("could not write " + cert_path);
  }
  return {};
}

Result<std::unique_ptr<asio::ssl::context>> make_server_tls(const std::string& cert_path,
                                                            const std::string& key_path) {
  auto context = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_server);
  context->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                       asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                       asio::ssl::context::no_tlsv1_1);
  std::error_code ec;
  context->use_certificate_chain_file(cert_path, ec);
  if (ec) {
    return Error::make(sqlstate::kIoError,
                       "could not load TLS certificate \"" + cert_path + "\": " + ec.message(),
                       "Check --tls-cert, or remove it to let pgrelay generate one.");
  }
  context->use_private_key_file(key_path, asio::ssl::context::pem, ec);
  if (ec) {
    return Error::make(sqlstate::kIoError,
                       "could not load TLS key \"" + key_path + "\": " + ec.message(),
                       "Check --tls-key; it must match the certificate.");
  }
  return context;
}

Result<std::unique_ptr<asio::ssl::context>> make_upstream_tls(
    const upstream::UpstreamConfig& config) {
  auto context = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_client);
  context->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                       asio::ssl::context::no_sslv3);
  if (config.sslmode >= upstream::SslMode::kVerifyCa) {
    std::error_code ec;
    if (!config.sslrootcert.empty()) {
      context->load_verify_file(config.sslrootcert, ec);
    } else {
      context->set_default_verify_paths(ec);
    }
    if (ec) {
      return Error::make(sqlstate::kIoError,
                         "could not load the upstream's root certificates: " + ec.message(),
                         "Set sslrootcert in the upstream URL to the CA file.");
    }
    context->set_verify_mode(asio::ssl::verify_peer);
  } else {
    context->set_verify_mode(asio::ssl::verify_none);
  }
  return context;
}

}  // namespace pgrelay::server
