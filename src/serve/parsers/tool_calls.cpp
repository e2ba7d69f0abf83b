#include "serve/parsers/tool_calls.h"

#include "serve/parsers/text_scan.h"

namespace moe::serve::parsers {

void add_text(Events& out, Event::Kind kind, std::string_view text) {
  if (text.empty()) return;
  if (!out.empty() && out.back().kind == kind) {
    out.back().text.append(text);
    return;
  }
  Event e;
  e.kind = kind;
  e.text.assign(text);
  out.push_back(std::move(e));
}

ToolCallParser::ToolCallParser(ToolCallOptions opt) : opt_(std::move(opt)), openers_(openers(opt_.kind)) {}

void ToolCallParser::content(std::string_view s, Events& out) {
  if (after_call_) {
    s.remove_prefix(skip_ws(s));
    if (s.empty()) return;
    after_call_ = false;
  }
  size_t body = s.size();
  while (body > 0 && is_ws(s[body - 1])) --body;
  if (body == 0) {
    held_ws_.append(s);
    return;
  }
  add_text(out, Event::Kind::content, held_ws_);
  add_text(out, Event::Kind::content, s.substr(0, body));
  held_ws_.assign(s.substr(body));
}

void ToolCallParser::boundary() {
  held_ws_.clear();
  after_call_ = true;
}

void ToolCallParser::close_block(std::string_view body, bool terminated, Events& out) {
  const Opener& op = *open_;
  open_ = nullptr;
  auto calls = parse_block(opt_.kind, op, body, terminated, opt_.tools);
  if (calls && !opt_.only_name.empty())
    for (const ParsedCall& c : *calls)
      if (c.name != opt_.only_name) calls.reset();
  if (!calls) {
    // Not a call: the block's text, exactly as written, is content.
    content(op.marker, out);
    content(body, out);
    if (terminated && op.end == BlockEnd::marker) content(op.end_marker, out);
    return;
  }
  boundary();
  for (ParsedCall& c : *calls) {
    Event e;
    e.kind = Event::Kind::tool_call;
    e.call.id = opt_.new_id ? opt_.new_id() : std::string("call_0");
    e.call.name = std::move(c.name);
    e.call.arguments = c.arguments.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    out.push_back(std::move(e));
  }
}

void ToolCallParser::push(std::string_view text, Events& out) {
  buf_.append(text);
  for (;;) {
    if (!open_) {
      // The earliest marker opens a block; text before it is content.
      size_t best = std::string::npos;
      const Opener* which = nullptr;
      for (const Opener& op : openers_) {
        const size_t p = buf_.find(op.marker);
        if (p < best) best = p, which = &op;
      }
      if (!which) {
        size_t keep = 0;
        for (const Opener& op : openers_) keep = std::max(keep, partial_marker_len(buf_, op.marker));
        content(std::string_view(buf_).substr(0, buf_.size() - keep), out);
        buf_.erase(0, buf_.size() - keep);
        return;
      }
      content(std::string_view(buf_).substr(0, best), out);
      buf_.erase(0, best + which->marker.size());
      if (which->end == BlockEnd::drop) {
        boundary();
        continue;
      }
      open_ = which;
      scanned_ = 0;
      continue;
    }
    if (open_->end == BlockEnd::marker) {
      // Search only what the last search could not have seen (a marker may straddle).
      const size_t m = open_->end_marker.size();
      const size_t from = scanned_ >= m ? scanned_ - (m - 1) : 0;
      const size_t p = buf_.find(open_->end_marker, from);
      if (p == std::string::npos) {
        scanned_ = buf_.size();
        return;
      }
      const std::string body = buf_.substr(0, p);
      buf_.erase(0, p + m);
      close_block(body, true, out);
      continue;
    }
    // BlockEnd::json (Mistral): the block ends where its JSON closes. Rescanned from
    // the marker on each piece: calls are short, and the scan is a byte loop.
    const JsonExtent ext = mistral_extent(buf_);
    if (ext.status == JsonExtent::incomplete) return;
    if (ext.status == JsonExtent::invalid) {
      // "[TOOL_CALLS]" followed by something else: the marker is text; look on after it.
      const Opener& op = *open_;
      open_ = nullptr;
      content(op.marker, out);
      continue;
    }
    const std::string body = buf_.substr(0, ext.end);
    buf_.erase(0, ext.end);
    close_block(body, true, out);
  }
}

void ToolCallParser::finish(Events& out) {
  if (open_) {
    // The reply ended inside a block: a call only if its body proves it complete.
    const std::string body = std::move(buf_);
    buf_.clear();
    close_block(body, false, out);
  } else {
    content(buf_, out);
    buf_.clear();
  }
  add_text(out, Event::Kind::content, held_ws_);  // trailing whitespace not next to a call
  held_ws_.clear();
}

}  // namespace moe::serve::parsers
